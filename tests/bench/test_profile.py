"""The step profile's table (hisparse_jax.bench.profile). (profile_decode itself needs a GPU trace.)"""

from __future__ import annotations

from hisparse_jax.bench import kernel_categories, profile


def test_format_profile_names_every_category():
    p = profile.StepProfile(dict.fromkeys(kernel_categories.CATEGORIES, 1e-3), 9e-3, 3e-3, {"weights": 2**20},
                            {"hbm": 4e12, "host link": 5e10}, [])
    table = profile.format_profile([dict(mode="hisparse", context=64, batch=2, **p.as_dict())])
    assert all(c in table for c in kernel_categories.CATEGORIES) and "| 3.00 |" in table
