"""YAML that users write (space files, GPU catalogs): safe, and strict where PyYAML is lenient.

PyYAML's SafeLoader builds no objects but still expands aliases (``*name``: a few lines can stand for
billions of values, a "YAML bomb"), keeps the last of duplicated keys without a word, and recurses
once per nesting level. ``load_yaml`` refuses all three with a ValueError that says where.
"""

from __future__ import annotations

from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases and without duplicated mapping keys."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicated key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """The content of YAML text; ValueError (one line, with the line and column) if it is not YAML we read."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise ValueError(" ".join(str(exc).split())) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
