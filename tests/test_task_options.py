"""A task's options, checked where they come in: `key=` and `group=` functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crawlq import App, Context, InvalidElement


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'app.db'}")


@pytest.mark.parametrize(
    ("key", "match"),
    [
        (lambda element: element.get("id"), r"key function returned None, not a str"),
        (lambda element: len(element), r"key function returned 1 \(int\), not a str"),
        (lambda element: element["id"], r"key function raised KeyError: 'id'"),
    ],
    ids=["none", "int", "raising"],
)
async def test_a_key_function_must_give_a_str_or_the_elements_are_refused(
    app: App, key: Any, match: str
) -> None:
    """`str(key(element))` made every None key "None": distinct elements became one."""

    @app.task(group=None, key=key)
    async def items(ctx: Context, element: dict[str, str]) -> None: ...

    with pytest.raises(InvalidElement, match=rf"queue 'items': the {match}") as refused:
        await app.aschedule_many(items, [{"name": "a"}, {"name": "b"}])
    (stats,) = await (await app.backend()).queue_stats(["items"])
    await app.aclose()
    assert stats.total == 0
    assert """for element '{"name":"a"}'""" in str(refused.value)
    if "raised" in match:
        assert isinstance(refused.value.__cause__, KeyError)


async def test_a_group_function_that_raises_is_refused_naming_queue_and_element(
    app: App,
) -> None:
    @app.task(group=lambda element: element["tenant"])
    async def per_tenant(ctx: Context, element: dict[str, str]) -> None: ...

    with pytest.raises(
        InvalidElement,
        match=r"""queue 'per_tenant': the group function raised KeyError: 'tenant' for element"""
        r""" '\{"name":"a"\}'""",
    ) as refused:
        await app.aschedule(per_tenant, {"name": "a"})
    (stats,) = await (await app.backend()).queue_stats(["per_tenant"])
    await app.aclose()
    assert isinstance(refused.value.__cause__, KeyError)
    assert stats.total == 0
