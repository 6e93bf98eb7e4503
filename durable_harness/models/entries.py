"""Session tree entries: models that validate what callers append (stored as plain dicts;
``seq`` is assigned by storage at commit). Unknown entry types are kept verbatim."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from durable_harness.errors import FormatError
from durable_harness.ids import new_id, now_iso
from durable_harness.models import snake_case
from durable_harness.models.messages import Message


class EntryBase(BaseModel):
    """Fields every entry has: ``id``, ``parentId`` (``None`` for a root), ISO ``timestamp``."""

    model_config = ConfigDict(extra="allow")

    type: str
    id: str = Field(default_factory=new_id)
    parentId: str | None = None
    timestamp: str = Field(default_factory=now_iso)


class MessageEntry(EntryBase):
    """A conversation message (user, assistant, toolResult, custom, bashExecution)."""

    message: Message


class ModelChangeEntry(EntryBase):
    """The model switched to ``provider``/``modelId`` from here on down the path."""

    provider: str
    modelId: str


class ThinkingLevelChangeEntry(EntryBase):
    """The thinking level (``off``, ``minimal``, ``low``, ``medium``, ``high``...) changed."""

    thinkingLevel: str


class CompactionEntry(EntryBase):
    """Everything on the path before ``firstKeptEntryId`` is replaced by ``summary`` in context;
    ``tokensBefore``: the context size compacted (tokens); ``settings`` (optional, ours)
    snapshots ``{model, thinkingLevel}`` so a context walk can stop at the cut."""

    summary: str
    firstKeptEntryId: str | None = None
    tokensBefore: int = 0


class BranchSummaryEntry(EntryBase):
    """A summary of the abandoned branch ending at ``fromId``, shown as user-role context."""

    fromId: str
    summary: str


class CustomEntry(EntryBase):
    """Extension state (``customType``, ``data``); never part of the provider context."""

    customType: str
    data: Any = None


class CustomMessageEntry(EntryBase):
    """An extension message that enters the context as user-role content."""

    customType: str
    content: Any = ""
    display: bool = True


class LabelEntry(EntryBase):
    """A bookmark on ``targetId``; ``label=None`` clears it. Latest wins."""

    targetId: str
    label: str | None = None


class SessionInfoEntry(EntryBase):
    """Session metadata (display ``name``). Latest wins."""

    name: str | None = None


KNOWN_ENTRY_TYPES: dict[str, type[EntryBase]] = {
    snake_case(name.removesuffix("Entry")): cls
    for name, cls in list(globals().items())
    if isinstance(cls, type) and issubclass(cls, EntryBase) and cls is not EntryBase
}
"""Each entry type's model (every class above), by its ``type`` value: the class name in snake
case, without ``Entry``."""


_message_adapter: TypeAdapter[Any] = TypeAdapter(Message)


def validate_entry(data: dict[str, Any]) -> dict[str, Any]:
    """Check an entry dict against its type's model (an unknown ``type`` needs only ``id`` and
    ``parentId``) and return it unchanged.

    Raises:
        FormatError: the dict does not match its entry type (message names the entry id).
    """
    cls = KNOWN_ENTRY_TYPES.get(str(data.get("type")), EntryBase)
    try:
        cls.model_validate(data)
    except ValidationError as exc:
        raise FormatError(
            f"entry {data.get('id')!r} of type {data.get('type')!r} is malformed: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}",
            entry_id=data.get("id"),
        ) from exc
    return data


def validate_message(data: dict[str, Any]) -> dict[str, Any]:
    """Validate a message dict (any role) and return it unchanged.

    Raises:
        FormatError: the message does not match its role's model.
    """
    try:
        _message_adapter.validate_python(data)
    except ValidationError as exc:
        raise FormatError(f"malformed {data.get('role')!r} message: {exc.errors()[0]}") from exc
    return data
