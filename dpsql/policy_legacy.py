"""Policy text written for an older dpsql: read where a store holds it, refused in a new file."""

from __future__ import annotations

from typing import Any

from dpsql.errors import PolicyError

OLD_PUBLIC_COUNT = (
    "public_row_count: true (or false) is no longer accepted, because dpsql never takes a count "
    "of the rows as public: write the number of rows the data owner states as public knowledge "
    "(e.g. public_row_count: 32561), or remove the line and let each release estimate the "
    "count with noise")


def old_public_counts(raw: dict[str, Any], source: str,
                       stored: bool) -> tuple[dict[str, Any], set[str]]:
    """Refuse the old boolean ``public_row_count``; in a stored policy read it as absent.

    A store applied such a policy before the boolean was dropped: refusing it
    there would lock everyone out until an admin re-applies, while reading it
    as "not public" only costs the release a noisy count. Returns the policy
    without those lines and the datasets that said ``true`` (releases warn).
    """
    datasets = raw.get("datasets")
    if not isinstance(datasets, dict):
        return raw, set()
    old = [name for name, spec in datasets.items()
           if isinstance(spec, dict) and isinstance(spec.get("public_row_count"), bool)]
    if not old:
        return raw, set()
    if not stored:
        raise PolicyError(f"{source}: datasets.{old[0]}.public_row_count: {OLD_PUBLIC_COUNT}")
    cleaned = {name: {k: v for k, v in spec.items() if k != "public_row_count"}
               if name in old else spec for name, spec in datasets.items()}
    return {**raw, "datasets": cleaned}, {n for n in old if datasets[n]["public_row_count"]}
