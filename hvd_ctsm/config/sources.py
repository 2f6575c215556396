"""Where a config's values come from as text: YAML presets (a file, or one shipped in the
package) and `section.field=value` overrides. hvd_ctsm.config.types converts them to the fields'
types; hvd_ctsm.config builds the dataclasses from them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hvd_ctsm.config.types import check, parse_yaml


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Put each `section.field=value` into `values` as text; build() converts it by type."""
    for item in overrides:
        check("=" in item, f"override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        node = values
        *parents, leaf = dotted.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            check(isinstance(node, dict), f"{dotted}: {part} is not a section")
        node[leaf] = raw.strip()
    return values


def as_override(dotted: str, value) -> str:
    """`section.field=value` as a user would type it to get `value` back (apply_overrides)."""
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
    return f"{dotted}={text}"


def preset_names() -> list[str]:
    folder = resources.files("hvd_ctsm").joinpath("presets")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")) \
        if folder.is_dir() else []


def read_preset(path: str) -> dict:
    """A YAML file, else a preset shipped with the package (importlib.resources: works from
    a checkout, an installed wheel or a zip)."""
    if Path(path).is_file():
        text = Path(path).read_text()
    else:
        preset = resources.files("hvd_ctsm").joinpath("presets", f"{path}.yaml")
        check(preset.is_file(), f"config file {path} not found (presets: {preset_names()})")
        text = preset.read_text()
    values = parse_yaml(text, f"config file {path}") or {}
    check(isinstance(values, dict), f"{path} must hold a mapping of section: field: value")
    return values
