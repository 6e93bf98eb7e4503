"""A session: the tree verbs over a :class:`~durable_harness.storage.base.SessionStore`.

Every verb that writes returns only after its commit is durable (per the store's mode). A verb
appends under a lane's leaf and moves that leaf in the same commit; navigation only moves the
leaf, and that move is durable too (unlike pi, whose leaf is implicit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from durable_harness.errors import LaneSuspended, UnknownEntry
from durable_harness.ids import new_id, now_iso
from durable_harness.models.content import text_of
from durable_harness.session.context import Context, build_context, path_to
from durable_harness.storage.base import EntryOp, LaneOp, LaneState, Op, SessionStore, Store

TITLE_CHARS = 60
"""Most characters of a first prompt shown as a session's :attr:`Session.title`."""


@dataclass
class TreeNode:
    """One entry in a tree listing, with its children and resolved label."""

    entry: dict[str, Any]
    children: list[TreeNode] = field(default_factory=list)
    label: str | None = None


class Session:
    """One open session.

    Attributes:
        store: the backend session store.
    """

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._contexts: dict[str, Context] = {}
        # ops staged for the next commit (:meth:`stage`), their entries by id, leaves by lane
        self._staged: list[Op] = []
        self._staged_entries: dict[str, dict[str, Any]] = {}
        self._staged_leaves: dict[str, str | None] = {}

    # -- identity --------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id."""
        return self.store.session_id

    @property
    def cwd(self) -> str:
        """The working directory the session belongs to."""
        return str(self.store.header.get("cwd", ""))

    @property
    def damage(self) -> list[dict[str, Any]]:
        """Damage reported when the session was opened (see ``storage.base.damage``)."""
        return self.store.damage

    def close(self) -> None:
        """Close the store and release the lease."""
        self.store.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------
    def lane(self, name: str = "main") -> LaneState:
        """Return a lane's state (``main`` always exists; an unknown lane is empty), its leaf
        moved by staged ops (:meth:`stage`)."""
        state = self.store.lane(name)
        if name in self._staged_leaves:
            state.leaf_id = self._staged_leaves[name]
        return state

    def leaf(self, lane: str = "main") -> str | None:
        """Return the lane's leaf entry id (``None`` before the first entry), staged ops
        included."""
        if lane in self._staged_leaves:
            return self._staged_leaves[lane]
        return self.store.lane_leaf(lane)

    def entry(self, entry_id: str) -> dict[str, Any]:
        """Return an entry (a staged one included).

        Raises:
            UnknownEntry: no entry has this id.
        """
        entry = self._get(entry_id)
        if entry is None:
            raise UnknownEntry(f"no entry {entry_id} in session {self.id}", entry_id=entry_id)
        return entry

    def _get(self, entry_id: str) -> dict[str, Any] | None:
        """The entry getter of every read here: a staged entry, else the store's."""
        if self._staged_entries:
            staged = self._staged_entries.get(entry_id)
            if staged is not None:
                return staged
        return self.store.get_entry(entry_id)

    def path(self, leaf_id: str | None) -> list[dict[str, Any]]:
        """Return the entries from the root to ``leaf_id``."""
        return path_to(self._get, leaf_id)

    def context(self, leaf_id: str | None = None, *, lane: str = "main") -> Context:
        """Build the provider context from ``leaf_id`` (default: the lane's leaf).

        A lane's context is extended from the one built last time (entries never change), and
        returned as is while the leaf has not moved: treat it as read-only.

        Raises:
            UnknownEntry: ``leaf_id`` is given and does not exist.
        """
        explicit = leaf_id
        if leaf_id is not None:
            self.entry(leaf_id)
        else:
            leaf_id = self.leaf(lane)
        cached = self._contexts.get(lane) if explicit is None else None
        if cached is not None and cached.state is not None and cached.state.leaf_id == leaf_id:
            return cached
        previous = cached.state if cached is not None else None
        ctx = build_context(self._get, leaf_id, previous, pi_turns=self.written_by_pi)
        if explicit is None and ctx.state is not None:
            self._contexts[lane] = ctx
        header = self.store.header
        if ctx.model is None and header.get("provider") and header.get("modelId"):
            # pi v1 headers carry the initial model
            ctx.model = {"provider": str(header["provider"]), "modelId": str(header["modelId"])}
        return ctx

    @property
    def written_by_pi(self) -> bool:
        """True for a pi file opened in place or imported (its header names the pi version it
        came from): its context follows pi's turn rules (``design/context.md``)."""
        header = self.store.header
        return "migratedFrom" in header or "piSessionId" in header

    @property
    def name(self) -> str | None:
        """The session's display name: the latest ``session_info`` entry wins."""
        infos = self.store.iter_entries(("session_info",))
        return infos[-1].get("name") if infos else None

    @property
    def title(self) -> str | None:
        """What lists show for the session: its :attr:`name`, else the first line of its first
        user message (at most :data:`TITLE_CHARS` characters, ``…`` when cut), else ``None``."""
        if self.name:
            return self.name
        for e in self.store.iter_entries(("message",)):
            message = e.get("message") or {}
            if message.get("role") == "user":
                text = text_of(message.get("content")).strip().split("\n", 1)[0]
                if text:
                    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
        return None

    def labels(self) -> dict[str, str]:
        """Return ``{target entry id: label}``; the latest label entry per target wins."""
        out: dict[str, str] = {}
        for e in self.store.iter_entries(("label",)):
            if e.get("label"):
                out[str(e["targetId"])] = str(e["label"])
            else:
                out.pop(str(e.get("targetId")), None)
        return out

    def tree(self) -> list[TreeNode]:
        """Return the whole tree as root nodes (children in ``seq`` order)."""
        nodes: dict[str, TreeNode] = {}
        roots: list[TreeNode] = []
        labels = self.labels()
        for e in self.store.iter_entries():
            nodes[str(e["id"])] = TreeNode(e, label=labels.get(str(e["id"])))
        for node in nodes.values():
            parent = node.entry.get("parentId")
            if parent and parent in nodes:
                nodes[parent].children.append(node)
            else:
                roots.append(node)
        return roots

    # -- writing ---------------------------------------------------------------------------
    def stage(self, ops: list[Op]) -> None:
        """Stage ``ops`` for the next :meth:`commit`, which writes them first, in the same
        commit (one JSONL line, one SQL transaction): the harness's merged commits
        (``design/run-loop.md`` "Merged commits"). Until then the reads here (``leaf``,
        ``lane``, ``entry``, ``path``, ``context``) see them as written; the store does not.
        Staged ops are checked by the store when written, not here."""
        self._staged.extend(ops)
        for op in ops:
            if isinstance(op, EntryOp):
                self._staged_entries[str(op.entry["id"])] = op.entry
                if op.lane is not None:
                    self._staged_leaves[op.lane] = str(op.entry["id"])
            elif isinstance(op, LaneOp) and op.sets_leaf():
                self._staged_leaves[op.lane] = op.leaf_id

    @property
    def staged(self) -> bool:
        """True while ops are staged and not yet written (:meth:`stage`)."""
        return bool(self._staged)

    def drop_staged(self) -> None:
        """Forget the staged ops without writing them (a fenced harness: as if it had died
        before writing them)."""
        self._staged = []
        self._staged_entries = {}
        self._staged_leaves = {}

    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        """Commit the staged ops and then ``ops`` in one store commit (per
        :meth:`SessionStore.commit <durable_harness.storage.base.SessionStore.commit>`,
        whose errors it raises; the staged ops are gone either way); returns the last seq."""
        if self._staged:
            ops = [*self._staged, *ops]
            self.drop_staged()
        return self.store.commit(ops, wait=wait)

    def make_entry(
        self, entry: dict[str, Any], *, parent_id: str | None, validate: bool = True
    ) -> dict[str, Any]:
        """Return ``entry`` with ``id`` (provisioned if absent), ``parentId`` and ``timestamp``,
        validated unless ``validate=False`` (for entries the library built itself from input it
        already validated).

        Raises:
            FormatError: the entry does not match its type's model.
        """
        full = {"id": new_id(), "timestamp": now_iso(), **entry, "parentId": parent_id}
        if not validate:
            return full
        # imported here: the entry models build pydantic's schemas, which a reader (most CLI
        # commands) never needs (design/cli.md, "Start-up")
        from durable_harness.models.entries import validate_entry

        return validate_entry(full)

    def append(
        self, entry: dict[str, Any], *, lane: str = "main", extra: list[Op] | None = None
    ) -> dict[str, Any]:
        """Append ``entry`` under the lane's leaf, move the leaf to it, and commit ``extra`` ops
        in the same commit. Returns the stored entry (with ``id``)."""
        full = self.make_entry(entry, parent_id=self.leaf(lane))
        self.commit([EntryOp(full, lane=lane), *(extra or [])])
        return full

    def append_message(self, message: dict[str, Any], *, lane: str = "main") -> dict[str, Any]:
        """Append a ``message`` entry holding ``message`` (any role)."""
        return self.append({"type": "message", "message": message}, lane=lane)

    def set_model(self, provider: str, model_id: str, *, lane: str = "main") -> dict[str, Any]:
        """Append a ``model_change`` entry."""
        return self.append(
            {"type": "model_change", "provider": provider, "modelId": model_id}, lane=lane
        )

    def set_thinking_level(self, level: str, *, lane: str = "main") -> dict[str, Any]:
        """Append a ``thinking_level_change`` entry."""
        return self.append({"type": "thinking_level_change", "thinkingLevel": level}, lane=lane)

    def set_name(self, name: str, *, lane: str = "main") -> dict[str, Any]:
        """Append a ``session_info`` entry naming the session."""
        return self.append({"type": "session_info", "name": name}, lane=lane)

    def set_label(self, target_id: str, label: str | None, *, lane: str = "main") -> dict[str, Any]:
        """Label ``target_id`` (``None`` clears). Raises UnknownEntry for a missing target."""
        self.entry(target_id)
        return self.append({"type": "label", "targetId": target_id, "label": label}, lane=lane)

    def check_no_open_run(self, lane: str = "main") -> None:
        """Refuse to move a lane that has an interrupted run: its recovery resumes from the
        recorded leaf (``design/run-loop.md``).

        Raises:
            LaneSuspended: the lane's operation log has an open run.
        """
        open_run = self.lane(lane).run_id
        if open_run is not None:
            raise LaneSuspended(
                f"lane {lane!r} of session {self.id} has interrupted run "
                f"{open_run}; run `durable-harness recover` and `resume`",
                lane=lane,
                run_id=open_run,
            )

    def navigate(self, target_id: str | None, *, lane: str = "main") -> None:
        """Move the lane's leaf to ``target_id`` (``None``: before the first entry), durably.

        Raises:
            UnknownEntry: the target does not exist.
        """
        if target_id is not None:
            self.entry(target_id)
        self.commit([LaneOp(lane, leaf_id=target_id)])

    def branch_with_summary(
        self, target_id: str | None, summary: str, *, lane: str = "main"
    ) -> dict[str, Any]:
        """Leave the current branch: append a ``branch_summary`` of it under ``target_id`` and
        move the leaf there, in one commit. Returns the summary entry."""
        if target_id is not None:
            self.entry(target_id)
        from_id = self.leaf(lane)
        full = self.make_entry(
            {"type": "branch_summary", "fromId": from_id or "", "summary": summary},
            parent_id=target_id,
        )
        self.commit([EntryOp(full, lane=lane)])
        return full

    def create_lane(
        self, name: str, *, from_entry: str | None = None, config: dict[str, Any] | None = None
    ) -> LaneState:
        """Create lane ``name`` with its leaf at ``from_entry`` (durable)."""
        if from_entry is not None:
            self.entry(from_entry)
        self.commit([LaneOp(name, leaf_id=from_entry, config=config or {"created": True})])
        return self.lane(name)

    def fork(
        self,
        target: Store,
        entry_id: str | None,
        *,
        position: Literal["at", "before"] = "at",
        cwd: str | None = None,
        lane: str = "main",
    ) -> Session:
        """Fork a new session in ``target`` store at ``entry_id`` (``at``: including it;
        ``before``: up to its parent; ``None``: the lane's leaf), optionally under another
        ``cwd``, copying what pi copies (``design/context.md``, "Fork and clone"): in the same
        working directory the path to that entry without label entries, then one ``label``
        entry per labelled entry of the path (pi's ``createBranchedSession``); in another, the
        whole tree as :meth:`clone` copies it, the leaf at that entry (``forkFrom``). Entry ids
        are kept, operation logs are not; the new header names this one in ``parentSession``.

        Raises:
            UnknownEntry: ``entry_id`` does not exist.
        """
        leaf = self.leaf(lane) if entry_id is None else str(self.entry(entry_id)["id"])
        if position == "before" and leaf is not None:
            leaf = self.entry(leaf).get("parentId")
        if cwd is not None and cwd != self.cwd:
            return self._copy_tree(target, leaf, cwd)
        path = [e for e in self.path(leaf) if e.get("type") != "label"] if leaf else []
        new = Session(target.create_session(cwd or self.cwd, parent_session=self.id))
        ops = copy_ops(path)
        parent = str(path[-1]["id"]) if path else None
        kept = {str(e["id"]) for e in path}
        for target_id, label in self.labels().items():
            if target_id in kept:
                entry = new.make_entry(
                    {"type": "label", "targetId": target_id, "label": label}, parent_id=parent
                )
                ops.append(EntryOp(entry, lane="main"))
                parent = str(entry["id"])
        if ops:
            new.store.commit(ops)
        return new

    def clone(self, target: Store, *, cwd: str | None = None, lane: str = "main") -> Session:
        """Copy the whole tree (every entry, labels included, ids kept) into a new session of
        ``target``, optionally under another ``cwd``, with its leaf where ``lane``'s is: what
        pi's ``SessionManager.forkFrom`` keeps. Operation logs are not copied; the new header
        names this session in ``parentSession``."""
        return self._copy_tree(target, self.leaf(lane), cwd or self.cwd)

    def _copy_tree(self, target: Store, leaf: str | None, cwd: str) -> Session:
        new = target.create_session(cwd, parent_session=self.id)
        ops = copy_ops(self.store.iter_entries())
        if ops:
            new.commit([*ops, LaneOp("main", leaf_id=leaf)])
        return Session(new)


def copy_ops(entries: list[dict[str, Any]]) -> list[Op]:
    """Ops that copy ``entries`` (in order) onto lane ``main`` of another session, ids kept.

    An entry whose parent is not among the copied ones becomes a root there, with the lost parent
    kept in ``originalParentId``: a damaged source copies without losing the entry.
    """
    seen: set[str] = set()
    ops: list[Op] = []
    for e in entries:
        copy = {k: v for k, v in e.items() if k != "seq"}
        parent = copy.get("parentId")
        if parent is not None and parent not in seen:
            copy["originalParentId"] = parent
            copy["parentId"] = None
        seen.add(str(copy.get("id")))
        ops.append(EntryOp(copy, lane="main"))
    return ops
