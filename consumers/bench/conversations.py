"""Synthetic conversation turns for the fault benchmark: several tenants, users and sessions;
preferences, facts, plans, personal data and secrets (for the redact stage), and filler.

Deterministic for a seed. Each non-filler turn carries details of its own (numbers, names,
places), so most episodes are distinct; filler repeats, as it does in real chats, and the
pipeline folds a repeat into one memory that lists every turn it came from.
"""

from __future__ import annotations

import random
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
FILLER = ["ok thanks", "sounds good!", "sure", "lol", "great, thank you", "hmm ok", "yes"]
REPLIES = [
    "Noted, I will keep that in mind.",
    "Got it. Anything else for today?",
    "Thanks for telling me, I saved it.",
    "Understood, I will remind you.",
]


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


def _content(rng: random.Random, i: int, user: str) -> str:
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


@dataclass(frozen=True)
class Turn:
    tenant: str
    user: str
    session: str
    messages: list[tuple[str, str]]


def turns(n: int, tenants: int = 3, users: int = 4, seed: int = 13) -> list[Turn]:
    """``n`` turns spread over ``tenants`` tenants of ``users`` users each, a few sessions per
    user; about one in three turns has the assistant's reply too."""
    rng = random.Random(seed)  # a fixed workload, not a secret
    chosen = TENANTS[: max(1, min(tenants, len(TENANTS)))]
    out = []
    for i in range(n):
        tenant = chosen[i % len(chosen)]
        user = f"user{rng.randrange(users)}"
        session = f"s{rng.randrange(3)}"
        messages = [("user", _content(rng, i, user))]
        if rng.random() < 0.33:
            messages.append(("assistant", rng.choice(REPLIES)))
        out.append(Turn(tenant, user, session, messages))
    return out
