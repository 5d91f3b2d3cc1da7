"""A multi-turn job on its page in a real browser (Chromium + Playwright) against `brorl up`: the
samples table shows a stored episode turn by turn (the opening messages, the model's turns with
their tool calls and arguments, the tool results, the failed call highlighted, the reward),
tool output that looks like markup stays text, a single-turn sample beside it stays plain, and
the episode charts (turns, tool calls, tool errors, budget cuts, environment seconds) appear; an
episode the environment broke shows what broke it.

The stack's trainer is the double `tests/dashboard/agent_trainer.py`, which reports what the
multi-turn trainer reports; worker, sink, store, API and page are the real ones.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.dashboard.agent_trainer import AGENT_ENTRYPOINT, HOSTILE
from tests.dashboard.helpers import client, fake_trainer_stack, shot, tiny_spec
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "agent-dashboard", BRORL_TRAINER_ENTRYPOINT=AGENT_ENTRYPOINT)


def test_a_multi_turn_sample_reads_turn_by_turn_and_the_episode_charts_appear(stack, page):
    with client(stack) as c:
        job = c.submit(tiny_spec("agent", [{"n": 4, "prompts_per_step": 2, "steps": 3}]))
    page.goto(f"{stack.url}/jobs/{job['id']}")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=60_000)

    # The episode charts, with every series drawn from the streamed rows.
    for chart, points in (("#chart-env", 12), ("#chart-envtime", 9)):
        expect(page.locator(chart)).to_have_attribute("data-points", str(points), timeout=15_000)
        expect(page.locator(chart)).to_have_attribute("data-drawn", "true")
    expect(page.locator("#chart-env")).to_contain_text("tool errors")
    expect(page.locator("#chart-envtime")).to_contain_text("environment seconds")

    expect(page.locator("#samples-step")).to_have_value("3", timeout=15_000)
    multi = page.locator("#samples tbody tr[data-idx='0']")
    expect(multi.locator(".transcript")).to_be_visible()
    expect(page.locator("#samples thead th").last).to_have_text("transcript (turn by turn)")
    turns = multi.locator(".turn[data-role]")
    expect(turns).to_have_count(7)
    assert [turns.nth(i).get_attribute("data-role") for i in range(7)] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    expect(multi.locator(".turn-counts")).to_have_text("3 turns · 2 tool calls · 1 tool error")
    first_call = turns.nth(2).locator(".tool-call")
    expect(first_call.locator(".tool-name")).to_have_text("→ add")
    expect(first_call.locator(".tool-args")).to_have_text('{ "a": 123456, "b": 3 }')
    expect(turns.nth(3)).to_contain_text("123459")
    expect(turns.nth(3)).to_contain_text("add ← call_0")
    expect(turns.nth(3)).not_to_have_class("turn turn-tool turn-error")
    # The failed call is highlighted (its own colour) and its output is text, never markup.
    failed = multi.locator(".turn-error")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text(HOSTILE)
    assert failed.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(253, 233, 223)"
    assert page.locator("#samples img, #samples script").count() == 0
    assert page.evaluate("window.__pwned") is None
    expect(turns.nth(6)).to_contain_text("<answer>123459</answer>")
    expect(multi.locator(".turn-reward")).to_have_text("reward 1 ✓")
    # The single-turn sample beside it stays a plain completion.
    single = page.locator("#samples tbody tr[data-idx='1']")
    expect(single.locator(".transcript")).to_have_count(0)
    expect(single.locator("td").last).to_have_text("5")
    # An episode the environment broke says so, in the failed colour, as text.
    broken = page.locator("#samples tbody tr[data-idx='2']")
    expect(broken.locator(".env-error")).to_contain_text("the environment broke the episode")
    expect(broken.locator(".env-error pre")).to_have_text(f"ConnectionError: the server went away {HOSTILE}")
    assert page.locator("#samples img, #samples script").count() == 0
    multi.scroll_into_view_if_needed()
    shot(page, "agent-sample.png", full_page=True)
