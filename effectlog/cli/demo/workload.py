"""The demo's workload: agent operations across five kinds, and the faults of each delivery.

Everything is drawn from one seeded RNG, so the same seed gives the same operations, the
same crash points and the same provider faults for the effectlog run and the naive run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from effectlog.keys import make_key

#: The boundaries ``Worker.perform`` passes, where a delivery can be killed: before its first
#: write, after the one durable CREATE+RESERVE+DISPATCH append (nothing sent yet), after the
#: provider answered (nothing recorded yet), after RECORD.
CRASH_POINTS = ("before_dispatch", "after_dispatch", "after_provider_call", "after_record")
#: The same instants for a worker without effectlog: before the call, or after it returned
#: but before the job was acknowledged.
NAIVE_POINT = {"before_dispatch": "before_call", "after_dispatch": "before_call",
               "after_provider_call": "after_call", "after_record": "after_call"}
KINDS = ("email.send", "payment.charge", "ticket.create", "browser.click", "deploy.release")
_KIND_WEIGHTS = (35, 20, 20, 15, 10)
PERSISTENT_OUTAGE = 1_000_000  # lookups: the provider never answers during the demo
MAX_FAULTY_DELIVERIES = 3


@dataclass(frozen=True, slots=True)
class Fault:
    """What happens to one delivery of a job."""

    crash: str | None = None   # SIGKILL at this transition boundary
    timeout: bool = False      # the provider performs the call, the answer is lost
    slow_s: float = 0.0        # the provider's answer arrives this late

    @property
    def reaches_provider(self) -> bool:
        """Whether a worker without effectlog performs the call on this delivery."""
        return self.crash is None or NAIVE_POINT[self.crash] == "after_call"

    def to_json(self) -> dict[str, Any]:
        return {"crash": self.crash, "timeout": self.timeout, "slow_s": self.slow_s}


@dataclass(frozen=True, slots=True)
class Job:
    """One logical operation of an agent, and the planned faults of its deliveries."""

    operation_id: str
    kind: str
    target: str
    payload: dict[str, Any]
    faults: tuple[Fault, ...] = ()
    lookup_outage: int = 0  # how many lookups of its key answer UNAVAILABLE

    @property
    def key(self) -> str:
        return make_key(self.operation_id, self.kind, self.target)

    def fault(self, delivery: int) -> Fault:
        """The fault of delivery ``delivery`` (1-based); deliveries past the plan are clean."""
        return self.faults[delivery - 1] if delivery <= len(self.faults) else Fault()

    def message(self, delivery: int) -> dict[str, Any]:
        """The job as the queue hands it to a worker process."""
        return {"op": self.operation_id, "kind": self.kind, "target": self.target,
                "payload": self.payload, "delivery": delivery,
                **self.fault(delivery).to_json()}

    def naive_effects(self) -> int:
        """Provider effects a naive retry-on-restart worker causes: one per delivery that
        reaches the provider, up to and including the first delivery without a fault."""
        performed = sum(1 for f in self.faults if f.reaches_provider and (f.crash or f.timeout))
        return performed + 1


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """Sizes and fault rates (per delivery) of a workload."""

    operations: int = 300
    crash_rate: float = 0.1
    seed: int = 7
    timeout_rate: float = 0.03
    slow_rate: float = 0.02
    slow_s: tuple[float, float] = (2.5, 3.5)
    outage_rate: float = 0.3       # of the jobs that will need a lookup
    persistent_share: float = 0.3  # of those outages: the lookup never comes back
    kind_weights: tuple[int, ...] = field(default=_KIND_WEIGHTS)


def generate(settings: WorkloadSettings) -> list[Job]:
    """The seeded workload: ``settings.operations`` jobs with their faults."""
    rng = random.Random(settings.seed)
    jobs = []
    for n in range(settings.operations):
        kind = rng.choices(KINDS, weights=settings.kind_weights)[0]
        target, payload = _OPERATIONS[kind](rng)
        faults = _faults(rng, settings)
        outage = 0
        first = faults[0] if faults else Fault()
        needs_lookup = first.timeout or first.crash in ("after_dispatch", "after_provider_call")
        if needs_lookup and rng.random() < settings.outage_rate:
            persistent = rng.random() < settings.persistent_share
            outage = PERSISTENT_OUTAGE if persistent else rng.randint(1, 2)
        jobs.append(Job(f"agent{settings.seed}-step{n:04d}", kind, target, payload, faults,
                        outage))
    return jobs


def _faults(rng: random.Random, settings: WorkloadSettings) -> tuple[Fault, ...]:
    """Faulty deliveries until a clean one (which is left implicit unless it is slow)."""
    faults: list[Fault] = []
    while len(faults) < MAX_FAULTY_DELIVERIES:
        roll = rng.random()
        slow = rng.uniform(*settings.slow_s) if rng.random() < settings.slow_rate else 0.0
        if roll < settings.crash_rate:
            faults.append(Fault(crash=rng.choice(CRASH_POINTS), slow_s=slow))
        elif roll < settings.crash_rate + settings.timeout_rate:
            faults.append(Fault(timeout=True, slow_s=slow))
        else:
            if slow:
                faults.append(Fault(slow_s=slow))
            break
    return tuple(faults)


# -- plausible targets and payloads -----------------------------------------------------

_PEOPLE = ("ana", "bo", "chen", "dara", "eli", "fatima", "goran", "hana", "ines", "jon")
_DOMAINS = ("example.com", "example.org", "acme.test", "shop.example")


def _ref(rng: random.Random, prefix: str, digits: int = 6) -> str:
    return f"{prefix}-{rng.randrange(10 ** (digits - 1), 10 ** digits)}"


def _email(rng: random.Random) -> tuple[str, dict[str, Any]]:
    template = rng.choice(("invoice_reminder", "welcome", "password_reset", "order_shipped"))
    return (f"mailto:{rng.choice(_PEOPLE)}.{rng.randrange(100)}@{rng.choice(_DOMAINS)}",
            {"template": template, "subject": template.replace("_", " ").capitalize(),
             "ref": _ref(rng, "INV")})


def _payment(rng: random.Random) -> tuple[str, dict[str, Any]]:
    customer = "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", k=10))
    return (f"stripe:cus_{customer}",
            {"amount_cents": rng.randrange(500, 50_000), "currency": rng.choice(("EUR", "USD")),
             "invoice": _ref(rng, "INV")})


def _ticket(rng: random.Random) -> tuple[str, dict[str, Any]]:
    title = rng.choice(("Refund request", "Disk usage above 90%", "Login loop on mobile",
                        "Duplicate invoice reported", "Certificate expires in 7 days"))
    return (f"jira:{rng.choice(('OPS', 'SUP', 'SEC', 'BILL'))}",
            {"title": title, "priority": rng.choice(("P1", "P2", "P3", "P4")),
             "customer": _ref(rng, "C", 5)})


def _browser(rng: random.Random) -> tuple[str, dict[str, Any]]:
    order = rng.randrange(10_000, 99_999)
    action = rng.choice(("approve", "cancel", "refund", "ship"))
    return (f"https://admin.shop.example/orders/{order}#{action}",
            {"selector": f"button[data-action={action}]", "order": order})


def _deploy(rng: random.Random) -> tuple[str, dict[str, Any]]:
    service = rng.choice(("billing", "search", "checkout", "notifications"))
    version = f"{rng.randrange(1, 4)}.{rng.randrange(20)}.{rng.randrange(10)}"
    return (f"deploy:{service}@{rng.choice(('staging', 'prod'))}",
            {"version": version, "commit": f"{rng.getrandbits(48):012x}"})


_OPERATIONS = {"email.send": _email, "payment.charge": _payment, "ticket.create": _ticket,
               "browser.click": _browser, "deploy.release": _deploy}
