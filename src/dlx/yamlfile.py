"""YAML as dlx reads its own files (recipes, curation rules): `yaml.safe_load` (no Python object is ever
constructed) that also refuses a key given twice in one mapping, which PyYAML would resolve to the last one without a
word."""

from __future__ import annotations

from typing import Any

import yaml


def load_unique_keys(text: str) -> Any:
    """What yaml.safe_load returns for `text`; yaml.YAMLError (a ConstructorError naming the key and its line) for a
    key given twice in one mapping."""
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [self.construct_object(key, deep=True) for key, _ in node.value if not key.tag.endswith(":merge")]
        for key in keys:
            if isinstance(key, (str, int, float, bool)) and keys.count(key) > 1:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", node.start_mark)
        return super().construct_mapping(node, deep)
