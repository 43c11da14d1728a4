"""pescheduler.redact: the one helper that keeps secrets out of texts and parameter sets."""

from pescheduler.control.state import DeploymentState
from pescheduler.errors import DeploymentFailed
from pescheduler.operator import DeadLetter
from pescheduler.redact import MASK, redact, redact_params


def test_url_passwords_are_masked_and_the_rest_kept():
    assert redact("redis://:pw@127.0.0.1:6379/0 and https://me:p%40ss@h.example/x") == \
        f"redis://:{MASK}@127.0.0.1:6379/0 and https://me:{MASK}@h.example/x"
    assert redact("tcp://127.0.0.1:8786 http://host:8787/status") == "tcp://127.0.0.1:8786 http://host:8787/status"


def test_secret_named_settings_are_masked_in_reprs_and_assignments():
    text = redact("{'sasl.password': 's3cret', 'sasl.username': 'me'} password=hunter2 api_key: k")
    assert "s3cret" not in text and "hunter2" not in text and " k" not in text.split("api_key:")[1][:2]
    assert "'sasl.username': 'me'" in text


def test_parameter_sets_are_masked_by_key_and_by_url_nested():
    params = {"url": "redis://u:pw@h/0", "config": {"sasl.password": "pw", "acks": "all"},
              "brokers": ["k://a:pw@h:9092"], "token": None, "n": 3}
    assert redact_params(params) == {"url": f"redis://u:{MASK}@h/0",
                                     "config": {"sasl.password": MASK, "acks": "all"},
                                     "brokers": [f"k://a:{MASK}@h:9092"], "token": None, "n": 3}


def test_status_errors_events_dead_letters_and_failures_are_redacted():
    state = DeploymentState()
    state.event("error", "cannot reach redis://:pw@h:1/0")
    state.fail("cannot reach redis://:pw@h:1/0")
    dead = DeadLetter.of({"n": 1}, ValueError("sasl.password='pw' refused"))
    texts = [state.error, *(e["text"] for e in state.events), dead.error,
             str(DeploymentFailed("redis://:pw@h:1/0"))]
    assert all("pw@" not in t and "'pw'" not in t for t in texts), texts
