"""`task.env` at submission: a job may only name the environments the operator lists.

A verifiers environment id must be in BRORL_ENVIRONMENTS, an OpenEnv server name in
BRORL_OPENENV_SERVERS (a URL from a tenant is never contacted: no server-side request
forgery), and a tools source must parse and define tools. Each refusal is a 422 naming the
setting and the field, nothing is enqueued, and nothing is loaded or contacted by the API.
"""
from __future__ import annotations

import json

import pytest

from tests.api.helpers import assert_error, make_spec

SERVERS = json.dumps({"guess": "http://127.0.0.1:9", "wordle": {"url": "http://wordle.internal:8000"}})
ADD = 'def add(a: int, b: int) -> int:\n    """Add two numbers.\n\n    Args:\n        a: one\n        b: two\n    """\n    return a + b\n'


@pytest.fixture(autouse=True)
def operator_lists(monkeypatch):
    monkeypatch.setenv("BRORL_ENVIRONMENTS", "vf-calc,acme/vf-guess")
    monkeypatch.setenv("BRORL_OPENENV_SERVERS", SERVERS)


def env_job(**env) -> dict:
    task = {"env": env}
    if env.get("type") == "tools":
        task["reasoning_gym"] = {"name": "chain_sum", "train_size": 100, "eval_size": 10}
    return make_spec(task=task)


def refused(client, auth, enqueued, body, field: str, *words: str) -> str:
    err = assert_error(client.post("/v1/jobs", json=body, headers=auth), 422, "validation_error", field=field)
    for word in words:
        assert word in err["message"], err
    assert enqueued == []
    return err["message"]


# ------------------------------------------------------------------ listed names pass, nothing loaded


@pytest.mark.parametrize("env", [
    {"type": "verifiers", "name": "vf-calc", "args": {"num_examples": 8}},
    {"type": "verifiers", "name": "acme/vf-guess"},
    {"type": "openenv", "name": "guess", "args": {"train_size": 16}},
    {"type": "openenv", "name": "wordle"},     # not reachable from here: the API never contacts it
    {"type": "tools", "tools": ADD},
    {"type": "tools", "code_interpreter": True},
])
def test_a_listed_environment_is_accepted(client, auth, enqueued, env):
    resp = client.post("/v1/jobs", json=env_job(**env), headers=auth)
    assert resp.status_code == 201, resp.text
    assert enqueued == [resp.json()["id"]]
    assert resp.json()["spec"]["task"]["env"]["type"] == env["type"]


# ------------------------------------------------------------------ names the operator did not list


@pytest.mark.parametrize("name", [
    "vf-other",
    "vf-calc-evil",                              # a prefix of a listed one is not listed
    "VF-CALC",                                   # nor another case
    "https://evil.example/vf_calc.py",
    "../../../../etc/passwd",
    "vf-calc/../../os",
    "os",                                         # an importable module is not an environment
    "vf-calc\nvf-guess",
    "vf-calc,acme/vf-guess",                      # the setting's own text
    "\u202evf-calc",
])
def test_an_unlisted_verifiers_id_is_422_naming_the_setting(client, auth, enqueued, name):
    msg = refused(client, auth, enqueued, env_job(type="verifiers", name=name), "task.env.name",
                  "BRORL_ENVIRONMENTS")
    assert "vf-calc" in msg  # what the tenant may name


@pytest.mark.parametrize("name", [
    "echo",
    "http://127.0.0.1:9",                         # a listed server's own URL
    "http://169.254.169.254/latest/meta-data/",
    "file:///etc/passwd",
    "guess/../admin",
    "guess?x=1",
    " guess",
    "Guess",
    "__proto__",
])
def test_an_unlisted_openenv_server_is_422_naming_the_setting_and_never_a_url(client, auth, enqueued, name):
    msg = refused(client, auth, enqueued, env_job(type="openenv", name=name), "task.env.name",
                  "BRORL_OPENENV_SERVERS")
    assert "never a URL" in msg
    assert "wordle.internal" not in msg and "127.0.0.1:9" not in msg.replace(repr(name[:100]), "")


def test_nothing_listed_refuses_every_name(client, auth, enqueued, monkeypatch):
    monkeypatch.delenv("BRORL_ENVIRONMENTS")
    monkeypatch.delenv("BRORL_OPENENV_SERVERS")
    assert "none listed" in refused(client, auth, enqueued, env_job(type="verifiers", name="vf-calc"),
                                    "task.env.name", "BRORL_ENVIRONMENTS")
    assert "none listed" in refused(client, auth, enqueued, env_job(type="openenv", name="guess"),
                                    "task.env.name", "BRORL_OPENENV_SERVERS")


def test_a_name_is_required_for_verifiers_and_openenv(client, auth, enqueued):
    refused(client, auth, enqueued, env_job(type="verifiers"), "task.env.name", "BRORL_ENVIRONMENTS")
    refused(client, auth, enqueued, env_job(type="openenv"), "task.env.name", "BRORL_OPENENV_SERVERS")


def test_a_huge_name_is_refused_by_its_bound(client, auth, enqueued):
    refused(client, auth, enqueued, env_job(type="verifiers", name="a" * 100_000), "task.env.name")


def test_the_dry_run_refuses_the_same(client, auth, enqueued):
    resp = client.post("/v1/jobs?dry_run=true", json=env_job(type="openenv", name="http://10.0.0.1"),
                       headers=auth)
    err = assert_error(resp, 422, "validation_error", field="task.env.name")
    assert "BRORL_OPENENV_SERVERS" in err["message"]
    assert client.get("/v1/jobs", headers=auth).json()["data"] == []


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize("args", [
    {"blob": "x" * 20_000},                              # past the spec's 16 KiB
    {"many": list(range(10_000))},
])
def test_huge_args_are_422_naming_args(client, auth, enqueued, args):
    refused(client, auth, enqueued, env_job(type="verifiers", name="vf-calc", args=args), "task.env.args")


def test_deeply_nested_args_are_a_422_not_a_500(client, auth, enqueued):
    body = json.dumps(env_job(type="openenv", name="guess", args={"a": "HERE"}))
    body = body.replace('"HERE"', "[" * 3000 + "]" * 3000)
    assert body.count("[") >= 3000
    resp = client.post("/v1/jobs", content=body, headers={**auth, "Content-Type": "application/json"})
    assert resp.status_code in (400, 413, 422), resp.text
    assert enqueued == []


def test_openenv_sizes_in_args_are_checked(client, auth, enqueued):
    refused(client, auth, enqueued, env_job(type="openenv", name="guess", args={"train_size": -1}),
            "task.env.args.train_size")
    refused(client, auth, enqueued, env_job(type="openenv", name="guess", args={"train_size": 10**12}),
            "task.env.args.train_size")


# ------------------------------------------------------------------ tools


@pytest.mark.parametrize("source, words", [
    ("def add(a: int, b: int) -> int\n    return a + b\n", ()),         # does not parse
    ("x = 1\n", ("tool",)),                                            # defines no tool
    ("'''only a docstring'''\n", ("tool",)),
    ("def _hidden(a: int) -> int:\n    return a\n", ()),
    ("\x00", ()),
    ("def f(" + "a, " * 20_000 + "):\n    pass\n", ()),
    ("x" * 100_001, ()),                                              # past the bound
    ("(" * 5000 + ")" * 5000 + "\n", ()),                               # deep enough to break a parser
])
def test_tools_that_do_not_parse_or_define_no_tool_are_422_naming_tools(client, auth, enqueued, source, words):
    refused(client, auth, enqueued, env_job(type="tools", tools=source), "task.env.tools", *words)


def test_tools_need_a_source_or_the_interpreter(client, auth, enqueued):
    refused(client, auth, enqueued, env_job(type="tools"), "task.env.tools")


def test_the_tools_source_is_never_run_at_submission(client, auth, enqueued, tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\n\n" + ADD
    resp = client.post("/v1/jobs", json=env_job(type="tools", tools=source), headers=auth)
    assert resp.status_code in (201, 422), resp.text
    assert not marker.exists()


# ------------------------------------------------------------------ the operator's own mistakes


@pytest.mark.parametrize("variable, value", [("BRORL_OPENENV_SERVERS", "{not json"),
                                              ("BRORL_ENVIRONMENTS", "a b c")])
def test_a_malformed_setting_is_a_503_not_the_tenants_fault(client, auth, enqueued, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    kind = "openenv" if variable == "BRORL_OPENENV_SERVERS" else "verifiers"
    name = "guess" if kind == "openenv" else "vf-calc"
    resp = client.post("/v1/jobs", json=env_job(type=kind, name=name), headers=auth)
    err = assert_error(resp, 503, "unavailable")
    assert "operator" in err["message"] and value not in err["message"]
    assert enqueued == []


def test_a_probe_on_an_unlisted_environment_is_refused(client, auth, enqueued):
    task = {"env": {"type": "openenv", "name": "http://169.254.169.254"}}
    resp = client.post("/v1/probes", json={"task": task, "n": 32, "prompts": 4}, headers=auth)
    err = assert_error(resp, 422, "validation_error", field="task.env.name")
    assert "BRORL_OPENENV_SERVERS" in err["message"]
    assert enqueued == []
