package dev.effectlog.tools.avro;

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.file.DataFileReader;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.io.JsonEncoder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * Apache Avro's own reading and writing of effectlog's records, line by line on stdin/stdout.
 *
 * <pre>
 * fingerprint SCHEMA...            per schema file (or inline JSON): the CRC-64-AVRO fingerprint, hex
 * decode READER [WRITER...]        hex single-object bytes in; {"record": Avro JSON, "reencoded": hex}
 *                                  or {"error": "..."} out (BinaryMessageDecoder, then -Encoder)
 * encode SCHEMA                    Avro JSON records in; hex single-object bytes out (BinaryMessageEncoder)
 * container FILE                   the records of an Avro object container file as Avro JSON lines
 * </pre>
 */
public final class Interop {
    private static final HexFormat HEX = HexFormat.of();

    private Interop() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: Interop fingerprint|decode|encode|container ARGS...");
            System.exit(2);
        }
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        List<String> rest = Arrays.asList(args).subList(1, args.length);
        switch (args[0]) {
            case "fingerprint" -> fingerprint(rest, out);
            case "decode" -> decode(rest, out);
            case "encode" -> encode(schema(rest.get(0)), out);
            case "container" -> container(new File(rest.get(0)), out);
            default -> {
                System.err.println("unknown command " + args[0]);
                System.exit(2);
            }
        }
        out.flush();
    }

    private static Schema schema(String fileOrJson) throws IOException {
        Schema.Parser parser = new Schema.Parser();
        File file = new File(fileOrJson);
        return file.isFile() ? parser.parse(file) : parser.parse(fileOrJson);
    }

    private static void fingerprint(List<String> schemas, PrintStream out) throws Exception {
        for (String name : schemas) {
            out.println(HEX.formatHex(SchemaNormalization.parsingFingerprint("CRC-64-AVRO", schema(name))));
        }
    }

    private static void decode(List<String> schemas, PrintStream out) throws IOException {
        Schema reader = schema(schemas.get(0));
        BinaryMessageDecoder<GenericRecord> decoder = new BinaryMessageDecoder<>(GenericData.get(), reader);
        for (String writer : schemas.subList(1, schemas.size())) {
            decoder.addSchema(schema(writer));
        }
        BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), reader);
        BufferedReader in = stdin();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (line.isBlank()) {
                continue;
            }
            GenericRecord record;
            try {
                record = decoder.decode(HEX.parseHex(line.strip()));
            } catch (IOException | RuntimeException e) {
                out.println("{\"error\": " + quote(e.getClass().getSimpleName() + ": " + e.getMessage()) + "}");
                continue;
            }
            ByteBuffer again = encoder.encode(record);
            byte[] bytes = new byte[again.remaining()];
            again.get(bytes);
            out.println("{\"record\": " + json(reader, record) + ", \"reencoded\": \"" + HEX.formatHex(bytes) + "\"}");
        }
    }

    private static void encode(Schema schema, PrintStream out) throws IOException {
        GenericDatumReader<GenericRecord> reader = new GenericDatumReader<>(schema);
        BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), schema);
        BufferedReader in = stdin();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (line.isBlank()) {
                continue;
            }
            GenericRecord record = reader.read(null, DecoderFactory.get().jsonDecoder(schema, line));
            ByteBuffer bytes = encoder.encode(record);
            byte[] data = new byte[bytes.remaining()];
            bytes.get(data);
            out.println(HEX.formatHex(data));
        }
    }

    private static void container(File file, PrintStream out) throws IOException {
        try (DataFileReader<GenericRecord> records = new DataFileReader<>(file, new GenericDatumReader<>())) {
            Schema schema = records.getSchema();
            for (GenericRecord record : records) {
                out.println(json(schema, record));
            }
        }
    }

    /** The Avro JSON encoding of one record (unions as {"branch": value}, bytes as ISO-8859-1). */
    private static String json(Schema schema, GenericRecord record) throws IOException {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        JsonEncoder encoder = EncoderFactory.get().jsonEncoder(schema, buffer);
        new GenericDatumWriter<GenericRecord>(schema).write(record, encoder);
        encoder.flush();
        return buffer.toString(StandardCharsets.UTF_8).strip();
    }

    private static String quote(String text) {
        StringBuilder quoted = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                quoted.append('\\').append(c);
            } else if (c < 0x20) {
                quoted.append(String.format("\\u%04x", (int) c));
            } else {
                quoted.append(c);
            }
        }
        return quoted.append('"').toString();
    }

    private static BufferedReader stdin() {
        return new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    }
}
