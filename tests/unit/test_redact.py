"""gpunode.ground.redact: every shape of secret a log or a message can hold is hidden, nothing else is, and
the cost is linear whatever the text."""

from __future__ import annotations

import time

import pytest

from gpunode.ground.redact import redact, secret_name

SHAPES = [
    # sglang's ServerArgs repr (what sglang logs at start), the only shape hidden before.
    ("ServerArgs(model_path='/model', api_key='sk-1', admin_api_key=None)",
     "ServerArgs(model_path='/model', api_key='***', admin_api_key=None)"),
    ('ServerArgs(api_key="sk-1", admin_api_key="sk-2")', 'ServerArgs(api_key="***", admin_api_key="***")'),
    # Command lines: a flag and its value, with a space or =, and a command's list repr.
    ("python -m sglang.launch_server --api-key sk-1 --port 30000", "python -m sglang.launch_server --api-key *** --port 30000"),
    ("--api-key=sk-1 --admin-api-key sk-2", "--api-key=*** --admin-api-key ***"),
    ("--admin-api-key=sk-2", "--admin-api-key=***"),
    ("--api-key 'sk 1' --hf-token \"hf_1\"", "--api-key '***' --hf-token \"***\""),
    ("['python3', '--api-key', 'sk-1', '--port', '30000']", "['python3', '--api-key', '***', '--port', '30000']"),
    # Headers and bearer tokens.
    ("Authorization: Bearer eyJhbGciOi.J9x-_", "Authorization: Bearer ***"),
    ('curl -H "Authorization: Basic dXNlcjpwYXNz" http://x', 'curl -H "Authorization: Basic ***" http://x'),
    ('{"Authorization": "Bearer abc"}', '{"Authorization": "Bearer ***"}'),
    ("got 401 for Bearer abc123==", "got 401 for Bearer ***"),
    # Environments and settings: NAME=value where NAME looks secret.
    ("HF_TOKEN=hf_abc NCCL_DEBUG=INFO", "HF_TOKEN=*** NCCL_DEBUG=INFO"),
    ("export OPENAI_API_KEY=sk-1; DB_PASSWORD='p w'", "export OPENAI_API_KEY=***; DB_PASSWORD='***'"),
    ("aws_secret_access_key = abc/def+g==", "aws_secret_access_key = ***"),
    ("https://hub.example/x?access_token=abc&page=2", "https://hub.example/x?access_token=***&page=2"),
    ('{"hf_token": "hf_1", "port": 30000}', '{"hf_token": "***", "port": 30000}'),
    ("{'ssl_keyfile_password': 'pw', 'tp_size': 8}", "{'ssl_keyfile_password': '***', 'tp_size': 8}"),
    # URL user-info: user and password hidden together.
    ("pip install -i https://user:pa55@pypi.example/simple x", "pip install -i https://***@pypi.example/simple x"),
    ("git clone https://ghp_token@github.com/o/r", "git clone https://***@github.com/o/r"),
]


@pytest.mark.parametrize(("text", "shown"), SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_each_shape_is_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown


NOT_SECRET = [
    "[2026-12-01] Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.04",
    "max_new_tokens=512 tokenizer_path=/model kv_cache_dtype=bf16 ssl_keyfile=/etc/key.pem",
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (https://pytorch.org/docs/stable/notes/cuda.html#env)",
    "admin_api_key=None, api_key='', hf_token=null, password=True",
    "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist",
    "use --api-key --port 30000",  # a flag with no value: the next flag is not its value
    "mail root@example.com or see https://example.com/a@b",
    "if api_key == expected:",
]


@pytest.mark.parametrize("text", NOT_SECRET, ids=[str(i) for i in range(len(NOT_SECRET))])
def test_what_is_not_secret_is_left_as_it_is(text: str) -> None:
    assert redact(text) == text


def test_known_values_are_hidden_wherever_they_are() -> None:
    text = "model /m served with key sk-abcdef; retry sk-abcdef-2; sk-abc"
    assert redact(text, known=("sk-abcdef-2", "sk-abcdef", "")) == "model /m served with key ***; retry ***; sk-abc"
    # The longer value first: one that holds another is hidden whole, not as '***-2'.
    assert redact("x sk-abcdef-2", known=("sk-abcdef", "sk-abcdef-2")) == "x ***"


def test_a_quoted_value_cut_before_its_closing_quote_is_hidden_to_the_end_of_its_line() -> None:
    assert redact("ServerArgs(api_key='sk-cut-here\nnext line") == "ServerArgs(api_key='***\nnext line"


def test_redacting_twice_changes_nothing_more() -> None:
    for text, shown in SHAPES:
        assert redact(shown) == shown


def test_secret_names() -> None:
    assert all(secret_name(n) for n in ("api_key", "--admin-api-key", "HF_TOKEN", "db_password", "CLIENT_SECRET",
                                          "x-api-key", "PASSWD"))
    assert not any(secret_name(n) for n in ("max_new_tokens", "tokenizer_path", "ssl_keyfile", "key", "token",
                                              "bos_token_id"))


@pytest.mark.parametrize("unit", ["--a", "a=", "'a'", "a.", "https://", "a:a@", "Bearer ", "Authorization: ",
                                  '"k": ', "--api-key ", "api_key='", "x" * 7 + " ", "a-"])
def test_linear_on_a_megabyte_of_each_shape_repeated(unit: str) -> None:
    text = unit * (1_000_000 // len(unit))
    began = time.process_time()
    redact(text, known=("not-there",))
    assert time.process_time() - began < 5
