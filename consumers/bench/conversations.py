"""Synthetic conversation turns for the benchmarks: several tenants, users and sessions;
preferences, facts, plans, personal data and secrets (for the redact stage), and filler.

Deterministic for a seed. Each non-filler turn carries details of its own (numbers, names,
places), so most episodes are distinct; filler repeats, as it does in real chats, and the
pipeline folds a repeat into one memory that lists every turn it came from. Two kinds of
user message share the vocabulary: ``chat_text`` (short, as typed in a chat; the faults
bench) and ``long_text`` (~300 characters with a planted detail, unique per turn; the ingest
bench, whose figures are per turn of that size).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

TENANTS = ["acme", "globex", "initech", "umbrella"]
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Quito", "Tallinn", "Perth", "Porto", "Bergen", "Hanoi"]
DRINKS = ["green tea", "oat flat white", "sparkling water", "rooibos", "cold brew", "chai"]
FOODS = ["peanuts", "shellfish", "gluten", "lactose", "sesame", "kiwi"]
JOBS = ["nurse", "architect", "welder", "teacher", "pilot", "baker", "actuary"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TASKS = [
    "renew the car insurance",
    "call the plumber about the boiler",
    "book the dentist",
    "send the quarterly report",
    "water the fig tree",
    "pay the electricity bill",
]
THINGS = [
    "the billing service",
    "our Postgres cluster",
    "the mobile app",
    "the data pipeline",
    "the search page",
    "the onboarding flow",
    "the nightly export",
    "the auth gateway",
]
FILLER = ["ok thanks", "sounds good!", "sure", "lol", "great, thank you", "hmm ok", "yes"]
REPLIES = [
    "Noted, I will keep that in mind.",
    "Got it. Anything else for today?",
    "Thanks for telling me, I saved it.",
    "Understood, I will remind you.",
]
# long_text: one planted detail, then padding sentences up to LONG_CHARS
LONG = [
    "My email is {name}.{n}@example.com and my phone is +1 415 555 {n4}, use those for the "
    "invoice about {thing}.",
    "I prefer {drink} in the morning and I really dislike meetings before ten, please keep "
    "that in mind when you plan {thing}.",
    "We decided to move {thing} to {city} by {day}, and {name} will own the migration plan "
    "number {n}.",
    "Remind me to review the pull request {n} for {thing} before {day}, it blocks the release.",
    "The fix was to raise the connection pool of {thing} to {n} and restart the workers in {city}.",
    "I live in {city} and I work as an engineer at a company that builds {thing}, ticket {n}.",
    "Can you summarise what happened with {thing} yesterday? I lost track after ticket {n}.",
    "My card 4111 1111 1111 1111 was charged twice for {thing}, order {n}, can you check?",
]
PADDING = [
    "I have been thinking about this since the meeting on {day}, and I am still not sure.",
    "The team spent most of {day} looking at dashboards and arguing about the numbers.",
    "Honestly it has been a long week, the release slipped twice and everyone is tired.",
    "We should write this down somewhere before we forget the details again next sprint.",
    "My manager asked for a summary by {day}, so a short answer would help a lot here.",
    "It is raining in {city} again, which is why I am working from home this week.",
]
LONG_CHARS = 280


def luhn_card(rng: random.Random) -> str:
    """A 16-digit number that passes the Luhn check (a test card, grouped in fours)."""
    digits = [4] + [rng.randrange(10) for _ in range(14)]
    total = 0
    for i, d in enumerate(reversed(digits)):
        doubled = d * 2 if i % 2 == 0 else d
        total += doubled - 9 if doubled > 9 else doubled
    digits.append((10 - total % 10) % 10)
    text = "".join(map(str, digits))
    return " ".join(text[i : i + 4] for i in range(0, 16, 4))


def chat_text(rng: random.Random, i: int, user: str) -> str:
    """A short chat message of one of ten kinds (one in ten is filler)."""
    name, city = rng.choice(NAMES), rng.choice(CITIES)
    n = rng.randrange(1000, 99999)
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice(FILLER)
    if kind == 1:
        return f"I prefer {rng.choice(DRINKS)} in the morning, never before my {n % 12 + 6} am run"
    if kind == 2:
        return f"I'm allergic to {rng.choice(FOODS)}, so skip recipe #{n} from the {city} book"
    if kind == 3:
        return (
            f"You can reach me at {user}.{n}@example.com or +1 415 555 {n % 10000:04d} "
            f"about order {i}"
        )
    if kind == 4:
        return f"My card {luhn_card(rng)} was charged twice for invoice {n}, please flag it"
    if kind == 5:
        return (
            f"The staging box is 10.{n % 250}.{i % 250}.{rng.randrange(1, 250)} and its "
            f"password=Tr0ub4dor{n}x, rotate it after ticket {i}"
        )
    if kind == 6:
        return (
            f"My {rng.choice(['sister', 'cousin', 'neighbour', 'friend'])} {name} lives in "
            f"{city} and works as a {rng.choice(JOBS)} since {1990 + n % 34}"
        )
    if kind == 7:
        return f"Remind me to {rng.choice(TASKS)} on {rng.choice(DAYS)} at {n % 12 + 1} pm (#{i})"
    if kind == 8:
        return f"We decided to move the {city} launch to week {n % 52 + 1}; {name} owns the plan"
    return f"Always answer me in short bullet points when I ask about budget line {n}"


def long_text(rng: random.Random, i: int, user: str) -> str:
    """A message of about LONG_CHARS characters: a planted detail (unique per ``i``) and
    padding sentences."""
    slots = {
        "name": rng.choice(NAMES),
        "city": rng.choice(CITIES),
        "thing": rng.choice(THINGS),
        "drink": rng.choice(DRINKS),
        "day": rng.choice(DAYS),
        "n": str(1000 + i),
        "n4": f"{i % 10000:04d}",
    }
    text = rng.choice(LONG).format(**slots)
    while len(text) < LONG_CHARS:
        text += " " + rng.choice(PADDING).format(**slots)
    return text


@dataclass(frozen=True)
class Session:
    tenant: str
    user: str
    session: str


@dataclass(frozen=True)
class Turn:
    tenant: str
    user: str
    session: str
    messages: list[tuple[str, str]]


def sessions(tenants: int = 3, users: int = 4, per_user: int = 3) -> list[Session]:
    """Every session of ``per_user`` sessions of ``users`` users of ``tenants`` tenants."""
    names = [TENANTS[t] if t < len(TENANTS) else f"tenant{t}" for t in range(max(1, tenants))]
    return [
        Session(tenant, f"user{u}", f"s{s}")
        for tenant in names
        for u in range(users)
        for s in range(per_user)
    ]


def turns(
    n: int,
    pool: list[Session],
    seed: int = 13,
    *,
    text: Callable[[random.Random, int, str], str] = chat_text,
    replies: float = 0.33,
    first: int = 0,
) -> list[Turn]:
    """Turns ``first`` .. ``first + n - 1``, turn ``i`` in session ``pool[i % len(pool)]``;
    a share ``replies`` of them has the assistant's reply too."""
    rng = random.Random(seed)  # a fixed workload, not a secret
    out = []
    for i in range(first, first + n):
        s = pool[i % len(pool)]
        messages = [("user", text(rng, i, s.user))]
        if rng.random() < replies:
            messages.append(("assistant", rng.choice(REPLIES)))
        out.append(Turn(s.tenant, s.user, s.session, messages))
    return out
