"""The one YAML reader of ``job.yaml``: PyYAML's safe loader with bounds checked before any value is built.

A job.yaml comes from a submitter, so reading it must cost little whatever it holds: a few hundred
bytes of aliases (a "billion laughs") expand to millions of values, 20,000 nested brackets overflow
the composer's recursion, a 5,000-digit integer is a ValueError in ``int()``. Here the text's size,
the nesting depth, the number of values counting every alias's expansion, recursive aliases and the
length of integers are all checked while the document's nodes are composed, before anything walks
them; a breach is a :class:`SpecTooLarge` (a ``yaml.MarkedYAMLError``) whose ``problem`` says what is
wrong and what to do, and whose ``problem_mark`` holds the line.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.events import AliasEvent

MAX_BYTES = 1 << 20  # a job.yaml is a few KiB
MAX_DEPTH = 32  # nesting levels of mappings and lists (job.yaml needs about 6)
MAX_VALUES = 20_000  # values (keys, items, scalars), every alias counted as what it expands to
MAX_INT_CHARS = 64  # an integer written with more characters is refused, not converted


class SpecTooLarge(yaml.MarkedYAMLError):
    """Raised when job.yaml breaks a bound (size, depth, alias expansion, a huge integer)."""

    def __init__(self, problem: str, mark: yaml.Mark | None = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.2), as users expect, and enforces the
    module's bounds while composing (depth, values, recursive aliases) and constructing (integers)."""

    def __init__(self, text: str) -> None:
        if len(text) > MAX_BYTES:
            raise SpecTooLarge(
                f"job.yaml is {len(text)} characters long; at most {MAX_BYTES} are read: keep large "
                "values (data, prompts) in files next to it"
            )
        super().__init__(text)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(collection node) -> values it expands to, once composed
        self._aliased = False  # an alias (*name) was met: the count includes expansions

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner looks ahead over every open [ or { (a possible simple key each) on every token:
        # quadratic in the flow depth (1,000 levels took it seconds), so the depth is bounded here too.
        if self.flow_level >= MAX_DEPTH:
            raise SpecTooLarge(self._too_deep(), self.get_mark())
        super().fetch_flow_collection_start(token_class)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) >= MAX_DEPTH:
            raise SpecTooLarge(self._too_deep(), self.get_mark())
        return bool(super().add_indent(column))

    @staticmethod
    def _too_deep() -> str:
        return f"values are nested more than {MAX_DEPTH} levels deep; job.yaml needs only a few levels"

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(AliasEvent):
            self._aliased = True
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.CollectionNode) and id(node) not in self._sizes:  # still open
                raise SpecTooLarge(
                    "an alias (*name) refers to the mapping or list that holds it; a job.yaml cannot be "
                    "recursive: write the value out",
                    mark,
                )
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise SpecTooLarge(self._too_deep(), mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        return node

    def compose_sequence_node(self, anchor: str | None) -> yaml.SequenceNode:  # type: ignore[override]
        return self._sized(super().compose_sequence_node, anchor)  # type: ignore[return-value]

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:  # type: ignore[override]
        return self._sized(super().compose_mapping_node, anchor)  # type: ignore[return-value]

    def _sized(self, compose: Any, anchor: str | None) -> yaml.Node:
        """Compose a collection, then record how many values it expands to and check the total."""
        mark = self.peek_event().start_mark
        node: yaml.CollectionNode = compose(anchor)
        mapping = isinstance(node, yaml.MappingNode)
        children = [c for pair in node.value for c in pair] if mapping else node.value
        size = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        if size > MAX_VALUES:
            raise SpecTooLarge(
                f"job.yaml holds more than {MAX_VALUES} values when its aliases (*name) are expanded; "
                "use fewer aliases, or write the values out"
                if self._aliased
                else f"job.yaml holds more than {MAX_VALUES} values (keys, list items and scalars); a "
                "job needs a few hundred: split a very large job (thousands of tasks:) into several",
                mark,
            )
        self._sizes[id(node)] = size
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(str(node.value)) > MAX_INT_CHARS:
            raise SpecTooLarge(
                f"an integer of {len(str(node.value))} characters; at most {MAX_INT_CHARS} are read "
                "(quote it to make it text)",
                node.start_mark,
            )
        return int(super().construct_yaml_int(node))


BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def compose(text: str) -> tuple[Any, yaml.Node | None]:
    """The document's value and its node tree (for lines), read within the bounds; ``yaml.YAMLError``
    (a :class:`SpecTooLarge` for a broken bound) when it cannot be read."""
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return data, node


def load(text: str) -> Any:
    """``yaml.safe_load`` within the bounds: the document's value; ``yaml.YAMLError`` otherwise."""
    return compose(text)[0]
