"""`brorl probe`'s printout: the curve, the figures, and a task.env job's episode figures."""
from cli import probe as probe_cli

RESULT = {"prompts": 2, "n": 4, "pass_at_k": {"1": {"mean": 0.5, "lo": 0.25, "hi": 0.75},
                                              "4": {"mean": 0.75, "lo": 0.5, "hi": 1.0}},
          "response_len_mean": 12.0, "truncated_frac": 0.0, "samples": 8, "tokens": 96,
          "seconds": 1.5, "samples_per_s": 5.3}
REC = {"broaden": False, "verdict": "stay narrow", "reason": "r", "schedule": []}


def test_episode_figures_are_printed_only_for_episodes(capsys, monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(probe_cli, "console", Console(width=200, force_terminal=False))
    probe_cli.print_result(RESULT, REC)
    assert "episodes:" not in capsys.readouterr().out
    env = {"turns_mean": 2.5, "tool_calls_mean": 1.25, "tool_errors_mean": 0.125,
           "budget_truncated_frac": 0.25, "errors": 1, "seconds": 3.0}
    probe_cli.print_result({**RESULT, "env": env}, REC)
    out = capsys.readouterr().out
    assert "2.50 turns, 1.25 tool calls and 0.12 tool errors per episode, 25.0% cut by the budget" in out
    assert "1 broken by the environment" in out
