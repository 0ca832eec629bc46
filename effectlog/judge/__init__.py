"""The one judge: whether an event a writer appended was accepted, and what a key's state is.

On a log without compare-and-append (Kafka) a writer cannot know at write time whether its
record wins; the order in the partition decides, and the projector's rules judge it. The
projection that owns the key is the judge: it answers a :class:`Query` with an
:class:`Answer` read from one consistent snapshot, naming the premises it rests on (the log's
topic ID, the projection generation, the fingerprint of the rules and writer schema that
judged it), and a writer checks every premise of every answer (:func:`check_answer`) before
it acts on it. A provider is called only after a positive :class:`Verdict` on the writer's
own DISPATCH.

:mod:`.query` holds the types and the :class:`Judge` port, :mod:`.premises` the checks and
fingerprints, :mod:`.wire` the JSON both sides speak, :mod:`.client` the HTTP client of
``effectlog serve``'s judge (``POST /v1/judge``).
"""

from effectlog.judge.premises import (
    CannotJudge,
    Expected,
    JudgeMismatch,
    check_answer,
    judge_fingerprint,
    known_fingerprints,
    worker_fingerprint,
)
from effectlog.judge.query import Answer, Judge, Premises, Query, Verdict, Written

__all__ = ["Answer", "CannotJudge", "Expected", "Judge", "JudgeMismatch", "Premises", "Query",
           "Verdict", "Written", "check_answer", "judge_fingerprint", "known_fingerprints",
           "worker_fingerprint"]
