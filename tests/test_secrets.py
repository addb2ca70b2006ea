"""Nothing secret leaves the process or is stored: a corpus of secret kinds, each in a real
failing log line, through every output (scan text/markdown/JSON, several files, watch --json,
kb add, kb export)."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import ROOT, run

# (kind, the text as it appears in a log, the part that must never come out)
CORPUS = [
    ("huggingface", "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "hf_AbCdEfGhIjKlMnOpQrSt"),
    ("openai", "--api-key sk-proj-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("anthropic", "key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv", "api03-AbCdEfGhIjKlMnOp"),
    ("github", "token ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "ghp_AbCdEfGhIjKlMnOpQrSt"),
    ("slack", "hook xoxb-1234567890-abcdefghijklmnop", "xoxb-1234567890"),
    ("aws key id", "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("aws secret", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("gcp", "key=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "AIzaSyA1b2C3d4E5f6G7h8"),
    (
        "azure",
        "DefaultEndpointsProtocol=https;AccountName=x;AccountKey=AbCdEfGhIjKlMnOpQrStUvWx==",
        "AbCdEfGhIjKlMnOpQrStUvWx",
    ),
    (
        "jwt",
        "cookie eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
        "dozjgNryP4J3jVmNHl0w5N",
    ),
    ("bearer", "Authorization: Bearer abcDEF123456ghiJKL", "abcDEF123456ghiJKL"),
    ("url password", "https://alice:s3cr3t-pass@hub.example.com/models", "s3cr3t-pass"),
    ("password setting", "password=hunter2hunter2", "hunter2hunter2"),
    ("private key", "-----BEGIN RSA PRIVATE KEY-----MIIEowIBAAKCAQEA7", "MIIEowIBAAKCAQEA7"),
    # the general rules (#26): kinds no fixed-prefix list knows
    ("url empty user", "redis://:p4ssw0rdRedis@cache:6379/0", "p4ssw0rdRedis"),
    ("url percent-encoded", "https://al%40ice:p%40ss%3Aw0rd9@hub.example.com/x", "p%40ss%3Aw0rd9"),
    (
        "slack webhook",
        "https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/AbCdEfGhIjKlMnOpQrStUvWx",
        "AbCdEfGhIjKlMnOpQrStUvWx",
    ),
    ("sendgrid", "SG.AbCdEfGhIjKlMnOpQrSt.UvWxYz0123456789AbCdEf", "UvWxYz0123456789AbCdEf"),
    ("google oauth", "client GOCSPX-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("escaped json key", '{\\"api_key\\": \\"Zq9Xw8Vu7Ts6Rq5Po4\\"}', "Zq9Xw8Vu7Ts6Rq5Po4"),
    ("docker auth", '{"auths":{"ghcr.io":{"auth":"dXNlcjpTM2NyM3RQYXNz"}}}', "dXNlcjpTM2NyM3RQYXNz"),
    (
        "npm",
        "//registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "AbCdEfGhIjKlMnOpQrSt",
    ),
    ("stripe", "charge failed with sk_live_AbCdEfGhIjKlMnOpQrSt12", "AbCdEfGhIjKlMnOpQrSt12"),
    ("pypi", "twine upload -p pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcC1xcnN0", "AgEIcHlwaS5vcmcCJGFi"),
    ("databricks", "host=x token dapi0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789"),
    # no known format: a random-looking value right after a word that says secret
    (
        "random after a secret word",
        "the gateway credential Zx8Qm2Lp9Vn4Rt7Kw1Hy3Bj6 was refused",
        "Zx8Qm2Lp9Vn4Rt7Kw1Hy3Bj6",
    ),
    # a log wrapped at a fixed width: the token's first part ends the line
    ("token cut by a wrapped line", "cloned with hf_AbCdEfGhIjKlMn", "AbCdEfGhIjKlMn"),
]


def _log(tmp_path, secret: str, name: str = "serve.log"):  # type: ignore[no-untyped-def]
    p = tmp_path / name
    p.write_text(
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        f"INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(model_tag='x', hf_token='{secret}', port=8000)\n"
        f"ERROR 05-26 18:54:00 [core.py:1] OSError: You are trying to access a gated repo ({secret}). "
        "401 Client Error: Unauthorized\n"
    )
    return p


@pytest.mark.parametrize("kind,secret,part", CORPUS, ids=[c[0] for c in CORPUS])
def test_no_secret_in_any_scan_output(cli, tmp_path, kind, secret, part):
    log = _log(tmp_path, secret)
    for args in (["scan"], ["scan", "--json"], ["scan", "--format", "markdown"], ["scan", "--all"]):
        p = run([*cli, *args, str(log)])
        assert p.returncode == 1, p.stderr
        assert part.encode() not in p.stdout + p.stderr, (kind, args)
    p = run([*cli, "scan", "--json", str(log), str(_log(tmp_path, secret, "b.log"))])
    assert part.encode() not in p.stdout and len(json.loads(p.stdout)) == 2


def test_show_secrets_keeps_them_for_local_use(cli, tmp_path):
    log = _log(tmp_path, "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345")
    p = run([*cli, "scan", "--show-secrets", str(log)])
    assert b"hf_AbCdEfGhIjKlMnOpQrSt" in p.stdout


def test_no_secret_in_watch_json(cli, tmp_path):
    log = _log(tmp_path, "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345")
    p = subprocess.run(
        [*cli, "watch", str(log), "--json", "--timeout", "20"], capture_output=True, timeout=60, cwd=ROOT
    )
    assert b"hf_AbCdEfGhIjKlMnOpQrSt" not in p.stdout + p.stderr
    assert json.loads(p.stdout)["status"] == "failed"


def test_no_secret_in_the_incident_store_or_its_export(cli, tmp_path):
    store = tmp_path / "kb"
    env = {"DIAGNOSE_KB": str(store)}
    parts = []
    for i, (_kind, secret, part) in enumerate(CORPUS):
        log = _log(tmp_path, secret, f"s{i}.log")
        p = run(
            [
                *cli,
                "kb",
                "add",
                "--from-log",
                str(log),
                "--root-cause",
                f"gated repo, token {secret}",
                "--fix",
                "log in with a token that has access",
            ],
            env=env,
        )
        assert p.returncode == 0, p.stderr
        parts.append(part)
    stored = "".join(f.read_text() for f in store.glob("*.yaml"))
    exported = run([*cli, "kb", "export"], env=env).stdout.decode()
    listed = run([*cli, "kb", "list"], env=env).stdout.decode()
    for part in parts:
        assert part not in stored and part not in exported and part not in listed, part


# the shapes a secret's line takes in real logs: key=value, key: value, JSON, a flag, a Python
# dict's repr, a sentence
CONTEXTS = [
    "api_key={}",
    "api_key: {}",
    '{{"api_key": "{}"}}',
    "--api-key {}",
    "{{'api_key': '{}'}}",
    "upstream refused {} for the gateway",
]


def test_every_kind_in_every_line_shape_through_every_renderer_and_the_live_view(tmp_path, know, capsys):
    """The matrix (#26): each kind of the corpus, in each line shape, as the error line of a
    failing log, through text, JSON and Markdown output and the live view's last line."""
    from diagnose.live.session import LiveSession
    from diagnose.outputs.registry import emit
    from diagnose.pipeline.scan import scan_paths

    assert len(CORPUS) >= 25
    leaks = []
    for kind, secret, part in CORPUS:
        for shape in CONTEXTS:
            line = shape.format(secret)
            log = tmp_path / "m.log"
            log.write_text(
                "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
                f"ERROR 05-26 18:54:00 [core.py:1] OSError: gated repo, 401 Client Error: Unauthorized: {line}\n"
            )
            d = scan_paths([str(log)], know)
            for fmt in ("text", "json", "markdown"):
                emit(fmt, [d], show_all=True)
                out = capsys.readouterr()
                if part in out.out + out.err:
                    leaks.append((kind, shape, fmt))
            session = LiveSession(know, "m.log")
            session.feed(f"INFO 05-26 18:53:37 [api_server.py:1] {line}\n".encode())
            if part in session.last_line:
                leaks.append((kind, shape, "live view"))
    assert not leaks, f"{len(leaks)} leaks of {len(CORPUS) * len(CONTEXTS) * 4}: {leaks[:10]}"


def test_no_secret_from_rules_test_probe_echo_or_the_live_view(cli, tmp_path, know):
    """The other ways out (#26): `rules test LOG` shows unexplained lines, a server's error body
    may echo the key it refused, the live view shows the log's last line."""
    from diagnose.live.session import LiveSession
    from diagnose.probe.result import ProbeResult
    from diagnose.probe.server_errors import error_cause

    secret = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx"
    log = tmp_path / "serve.log"
    log.write_text(f"ERROR 05-26 18:54:00 [x.py:1] upstream refused token={secret} for the gateway\n")
    p = run([*cli, "rules", "test", str(log)])
    assert b"AbCdEfGhIjKlMnOp" not in p.stdout + p.stderr
    res = ProbeResult(url="http://x")
    error_cause(res, 400, {"error": {"message": f"Incorrect API key provided: {secret}"}}, "")
    assert res.cause is not None and "AbCdEfGhIjKlMnOp" not in json.dumps(res.to_json())
    session = LiveSession(know, "serve.log")
    session.feed(f"INFO 05-26 18:53:37 [api_server.py:1] serving with api_key={secret}\n".encode())
    assert "AbCdEfGhIjKlMnOp" not in session.last_line


def test_the_gate_at_the_output_masks_what_no_diagnosis_carries(cli, tmp_path):
    """An error message, a warning, anything printed: the process's stdout and stderr redact
    every line on the way out (redact.RedactingWriter), so no command can bypass it."""
    secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    p = run([*cli, "scan", str(tmp_path / f"token-{secret}.log")])
    assert p.returncode == 2 and b"no such file" in p.stderr.lower() + p.stdout.lower()
    assert b"AbCdEfGhIjKlMnOpQrSt" not in p.stdout + p.stderr
    p = run([*cli, "kb", "search", secret])
    assert b"AbCdEfGhIjKlMnOpQrSt" not in p.stdout + p.stderr
