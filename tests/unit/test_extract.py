"""extract: which messages become memories."""

from memstream.pipeline.extract import extract
from memstream.schemas.events import Message, Role, TurnEvent


def turn(*messages: Message, **kw: object) -> TurnEvent:
    return TurnEvent(tenant="t", user="u", session="s", messages=list(messages), **kw)


def test_one_episode_from_user_and_final_assistant() -> None:
    """A plain exchange yields one episode holding both sides."""
    out = extract(
        turn(
            Message(role=Role.USER, content="It rained all day in Lisbon"),
            Message(role=Role.ASSISTANT, content="Noted!"),
        )
    )
    assert len(out) == 1
    assert out[0].content == "user: It rained all day in Lisbon\nassistant: Noted!"
    assert out[0].type.value == "episode"


def test_tool_system_reasoning_and_memory_messages_are_dropped() -> None:
    """System prompts, tool calls/results, reasoning and recalled memories never become memories."""
    out = extract(
        turn(
            Message(role=Role.SYSTEM, content="You are SYSTEMPROMPT"),
            Message(role=Role.USER, content="what is the weather"),
            Message(
                role=Role.ASSISTANT, content="calling TOOLCALL", tool_calls=[{"name": "weather"}]
            ),
            Message(role=Role.TOOL, content="TOOLRESULT 21C"),
            Message(role=Role.REASONING, content="REASONING here"),
            Message(role=Role.MEMORY, content="RECALLED memory"),
            Message(role=Role.ASSISTANT, content="draft NONFINAL", final=False),
            Message(role=Role.ASSISTANT, content="It is sunny"),
        )
    )
    text = out[0].content
    for marker in ("SYSTEMPROMPT", "TOOLCALL", "TOOLRESULT", "REASONING", "RECALLED", "NONFINAL"):
        assert marker not in text
    assert "what is the weather" in text and "It is sunny" in text


def test_turn_with_nothing_to_keep_yields_nothing() -> None:
    """A turn of only tool traffic gives no candidate."""
    assert extract(turn(Message(role=Role.TOOL, content="{}"))) == []


def test_candidate_ids_are_deterministic() -> None:
    """Replaying the same event gives the same candidate id (idempotent hand-off)."""
    ev = turn(Message(role=Role.USER, content="hello there"), event_id="e1")
    assert extract(ev)[0].candidate_id == extract(ev)[0].candidate_id
    other = turn(Message(role=Role.USER, content="hello there"), event_id="e2")
    assert extract(other)[0].candidate_id != extract(ev)[0].candidate_id


def test_sender_names_the_speaker() -> None:
    """A message's sender replaces the role as the speaker label."""
    out = extract(turn(Message(role=Role.USER, content="hi", sender="Caroline")))
    assert out[0].content == "Caroline: hi"
