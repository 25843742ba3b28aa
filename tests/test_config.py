"""Tests of option validation and of the IDENTIFY payload (nsqclient.config)."""

from __future__ import annotations

import copy
import pickle
import types
import typing
from collections.abc import Callable

import pytest

import nsqclient
from nsqclient import config as config_module
from nsqclient.checks import NotANumberError, check_float, check_int, is_int, is_number
from nsqclient.config import OPTIONS, Config, Option, check_owner, identify_payload

FLOAT_OPTIONS = sorted(name for name, opt in OPTIONS.items() if opt.kind is float)
INT_OPTIONS = sorted(name for name, opt in OPTIONS.items() if opt.kind is int)


@pytest.fixture
def fqdn(monkeypatch: pytest.MonkeyPatch) -> str:
    """Pin the host name identify_payload falls back on (no DNS lookup in tests)."""
    name = "worker-7.dc1.example.com"
    monkeypatch.setattr(config_module.socket, "getfqdn", lambda: name)
    return name


# ------------------------------------------------------------------------------------------
# Defaults


def test_defaults() -> None:
    c = Config()
    assert c.as_dict() == {name: opt.default for name, opt in OPTIONS.items()}
    assert (c.max_in_flight, c.concurrency, c.max_tries) == (1, 1, 5)
    assert (c.heartbeat_interval, c.read_timeout, c.dial_timeout) == (30.0, 60.0, 1.0)
    assert (c.output_buffer_size, c.output_buffer_timeout) == (16384, 0.25)
    assert c.msg_timeout is None and c.auth_secret is None and c.client_id is None
    assert c.backoff_strategy == "exponential"
    assert not (c.tls_v1 or c.snappy or c.deflate or c.youzan or c.extend_support)
    assert c.tls_verify is True


def test_every_default_passes_its_own_validation() -> None:
    for name, opt in OPTIONS.items():
        assert opt.name == name
        assert opt.validate(opt.default) == opt.default
        assert opt.doc


def _annotation_types(annotation: object) -> tuple[type, ...]:
    if isinstance(annotation, types.UnionType):
        return tuple(typing.get_args(annotation))
    assert isinstance(annotation, type), annotation
    return (annotation,)


def test_config_annotations_and_options_cannot_drift() -> None:
    """Config's class annotations (what a type checker sees) name exactly the options of OPTIONS
    (the defaults, ranges and docs), in the same order, with the same types."""
    hints = typing.get_type_hints(Config)
    assert list(hints) == list(OPTIONS)
    for name, opt in OPTIONS.items():
        accepted = _annotation_types(hints[name])
        kinds = opt.kind if isinstance(opt.kind, tuple) else (opt.kind,)
        assert set(accepted) - {type(None)} == set(kinds), name
        assert (type(None) in accepted) == opt.nullable, name
        default = opt.default
        assert isinstance(default, accepted), (name, default, hints[name])
        if bool not in accepted:
            assert not isinstance(default, bool), name


def test_options_are_slots_not_a_dict_lookup() -> None:
    """Consumer and Producer read options on hot paths: each is a slot of its own."""
    c = Config(max_in_flight=9)
    assert set(Config.__slots__) == set(OPTIONS)
    assert not hasattr(c, "__dict__")
    assert "__getattr__" not in vars(Config)  # a type checker would see Any through it
    assert isinstance(vars(Config)["max_in_flight"], types.MemberDescriptorType)
    assert c.max_in_flight == 9


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_option"):
        Config().no_such_option  # noqa: B018


# ------------------------------------------------------------------------------------------
# Types


@pytest.mark.parametrize("name", FLOAT_OPTIONS)
def test_int_accepted_for_float_option(name: str) -> None:
    opt = OPTIONS[name]
    # the default when it is a whole number (valid alone and beside every other default), else 1
    default = opt.default
    value = int(default) if isinstance(default, float) and default.is_integer() else 1
    got = getattr(Config(**{name: value}), name)
    assert type(got) is float and got == value


@pytest.mark.parametrize("name", INT_OPTIONS)
def test_bool_refused_for_int_option(name: str) -> None:
    with pytest.raises(TypeError, match=f"{name} must be an int.*, not True"):
        Config(**{name: True})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", ["dial_timeout", "msg_timeout", "pub_timeout"])
def test_nan_and_infinity_refused_for_float_option(name: str, value: float) -> None:
    # NaN compares False with every bound, so a range check alone let it through.
    with pytest.raises(ValueError, match=f"{name} must be a number of seconds \\(finite\\)"):
        Config(**{name: value})


def test_infinity_only_where_it_means_no_cap() -> None:
    assert Config(max_requeue_delay=float("inf")).max_requeue_delay == float("inf")
    with pytest.raises(ValueError, match="finite"):
        Config(max_requeue_delay=float("nan"))
    assert [name for name, opt in OPTIONS.items() if opt.infinite] == ["max_requeue_delay"]


@pytest.mark.parametrize("name", ["dial_timeout", "msg_timeout", "pub_timeout"])
def test_bool_refused_for_float_option(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        Config(**{name: True})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_in_flight", 2.0),
        ("max_in_flight", "10"),
        ("dial_timeout", "1"),
        ("tls_v1", 1),
        ("client_id", 5),
        ("auth_secret", 123),
        ("heartbeat_interval", None),  # not nullable
    ],
)
def test_wrong_type_is_a_type_error_naming_the_option(name: str, value: object) -> None:
    with pytest.raises(TypeError) as exc:
        Config(**{name: value})
    assert str(exc.value).startswith(name)
    assert repr(value) in str(exc.value)


def test_nullable_options_accept_none() -> None:
    c = Config(msg_timeout=None, client_id=None, auth_secret=None)
    assert c.msg_timeout is None and c.client_id is None and c.auth_secret is None


@pytest.mark.parametrize("secret", ["s3cr3t", b"s3cr3t"])
def test_auth_secret_accepts_str_and_bytes(secret: str | bytes) -> None:
    assert Config(auth_secret=secret).auth_secret == secret


# ------------------------------------------------------------------------------------------
# Ranges and choices


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_in_flight", -1),
        ("concurrency", 0),
        ("concurrency", 4097),
        ("sample_rate", 100),
        ("sample_rate", -1),
        ("deflate_level", 0),
        ("deflate_level", 10),
        ("max_tries", 65536),
        ("dial_timeout", 0.0),
        ("dial_timeout", 3601.0),
        ("heartbeat_interval", -2.0),
        ("output_buffer_size", -2),
        ("lookupd_poll_jitter", 1.5),
        ("max_frame_size", 1023),
        ("pub_retries", 101),
        ("msg_timeout", 0.0),
    ],
)
def test_out_of_range_is_a_value_error_naming_the_option(name: str, value: float) -> None:
    with pytest.raises(ValueError) as exc:
        Config(**{name: value})
    text = str(exc.value)
    assert text.startswith(name) and repr(value) in text
    assert OPTIONS[name].doc in text


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_in_flight", 0),
        ("concurrency", 4096),
        ("sample_rate", 99),
        ("deflate_level", 1),
        ("deflate_level", 9),
        ("heartbeat_interval", -1),
        ("output_buffer_size", -1),
        ("output_buffer_timeout", -1),
        ("lookupd_poll_jitter", 1),
        ("max_frame_size", 1024),
        ("max_tries", 0),
    ],
)
def test_range_bounds_are_inclusive(name: str, value: float) -> None:
    assert getattr(Config(**{name: value}), name) == value


def test_choices() -> None:
    assert Config(backoff_strategy="full_jitter").backoff_strategy == "full_jitter"
    with pytest.raises(ValueError, match="backoff_strategy must be one of") as exc:
        Config(backoff_strategy="linear")
    assert "'linear'" in str(exc.value) and "exponential" in str(exc.value)


def test_option_validate_with_tuple_kind_names_every_type() -> None:
    opt = Option("x", None, (str, bytes), "doc")
    with pytest.raises(TypeError, match="x must be str/bytes, not int 1"):
        opt.validate(1)


# ------------------------------------------------------------------------------------------
# Unknown options


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("max_inflight", "max_in_flight"), ("heartbeat", "heartbeat_interval"), ("snapy", "snappy")],
)
def test_unknown_option_suggests_the_closest_name(typo: str, meant: str) -> None:
    with pytest.raises(TypeError, match=f"unknown option '{typo}'; did you mean '{meant}'\\?"):
        Config(**{typo: 1})


def test_unknown_option_without_close_match_has_no_hint() -> None:
    with pytest.raises(TypeError, match="unknown option 'zzzzzzzz'") as exc:
        Config(zzzzzzzz=1)
    assert "did you mean" not in str(exc.value)


# ------------------------------------------------------------------------------------------
# replace(), immutability, repr


def test_replace_returns_a_validated_copy() -> None:
    base = Config(max_in_flight=10, snappy=True)
    new = base.replace(max_in_flight=20, concurrency=4)
    assert (new.max_in_flight, new.concurrency, new.snappy) == (20, 4, True)
    assert (base.max_in_flight, base.concurrency) == (10, 1)  # the original is untouched
    assert new is not base


def test_replace_can_go_back_to_the_default_and_to_none() -> None:
    base = Config(max_in_flight=10, msg_timeout=30)
    new = base.replace(max_in_flight=1, msg_timeout=None)
    assert new.max_in_flight == 1 and new.msg_timeout is None


def test_replace_validates() -> None:
    base = Config()
    with pytest.raises(ValueError, match="max_in_flight"):
        base.replace(max_in_flight=-5)
    with pytest.raises(TypeError, match="did you mean 'max_in_flight'"):
        base.replace(max_inflight=5)


def test_pickle_rebuilds_through_validation_with_pairs() -> None:
    # copy and pickle go through __reduce__, i.e. Config(**as_dict()): validated again.
    c = Config(tls_v1=True, tls_cert_file="c.pem", tls_key_file="k.pem")
    assert pickle.loads(pickle.dumps(c)).tls_key_file == "k.pem"


def test_config_is_immutable() -> None:
    c = Config(max_in_flight=3)
    with pytest.raises(AttributeError, match="immutable"):
        c.max_in_flight = 4
    with pytest.raises(AttributeError, match="immutable"):
        c.brand_new = 1
    with pytest.raises(AttributeError):
        del c.max_in_flight
    c.as_dict()["max_in_flight"] = 99  # as_dict() is a copy
    assert c.max_in_flight == 3


def test_repr_shows_only_changed_options() -> None:
    assert repr(Config()) == "Config()"
    assert repr(Config(max_in_flight=5, backoff_strategy="full_jitter")) == (
        "Config(max_in_flight=5, backoff_strategy='full_jitter')"
    )


@pytest.mark.parametrize("secret", ["hunter2", b"hunter2"])
def test_repr_hides_auth_secret(secret: str | bytes) -> None:
    text = repr(Config(auth_secret=secret, max_in_flight=2))
    assert "hunter2" not in text
    assert "auth_secret='***'" in text and "max_in_flight=2" in text


@pytest.mark.parametrize(
    "clone",
    [copy.copy, copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_config_can_be_copied_and_pickled(clone: Callable[[Config], Config]) -> None:
    c = Config(max_in_flight=7, auth_secret="s")
    back = clone(c)
    assert back.as_dict() == c.as_dict()


# ------------------------------------------------------------------------------------------
# identify_payload


def test_identify_payload_defaults(fqdn: str) -> None:
    payload = identify_payload(Config(), "1.2.3")
    assert payload == {
        "client_id": "worker-7",
        "hostname": fqdn,
        "user_agent": "nsqclient/1.2.3",
        "feature_negotiation": True,
        "heartbeat_interval": 30000,
        "output_buffer_size": 16384,
        "output_buffer_timeout": 250,
        "tls_v1": False,
        "snappy": False,
        "deflate": False,
        "deflate_level": 6,
        "sample_rate": 0,
    }
    assert "msg_timeout" not in payload and "extend_support" not in payload


def test_identify_payload_uses_configured_names(fqdn: str) -> None:
    c = Config(client_id="me", hostname="box", user_agent="app/2")
    payload = identify_payload(c, "0.1")
    assert (payload["client_id"], payload["hostname"], payload["user_agent"]) == (
        "me",
        "box",
        "app/2",
    )


def test_identify_payload_converts_seconds_to_milliseconds(fqdn: str) -> None:
    c = Config(heartbeat_interval=1.5, output_buffer_timeout=0.1, msg_timeout=45.25)
    payload = identify_payload(c, "0")
    assert payload["heartbeat_interval"] == 1500
    assert payload["output_buffer_timeout"] == 100
    assert payload["msg_timeout"] == 45250
    assert all(
        type(payload[k]) is int
        for k in ("heartbeat_interval", "output_buffer_timeout", "msg_timeout")
    )


def test_identify_payload_rounds_rather_than_truncates(fqdn: str) -> None:
    # 0.3 s is 299.999... ms in binary floating point
    assert identify_payload(Config(output_buffer_timeout=0.3), "0")["output_buffer_timeout"] == 300


@pytest.mark.parametrize("disabled", [-1, -1.0])
def test_identify_payload_minus_one_stays_minus_one(fqdn: str, disabled: float) -> None:
    c = Config(heartbeat_interval=disabled, output_buffer_timeout=disabled, output_buffer_size=-1)
    payload = identify_payload(c, "0")
    assert payload["heartbeat_interval"] == -1
    assert payload["output_buffer_timeout"] == -1
    assert payload["output_buffer_size"] == -1


def test_identify_payload_msg_timeout_only_when_set(fqdn: str) -> None:
    assert "msg_timeout" not in identify_payload(Config(msg_timeout=None), "0")
    assert identify_payload(Config(msg_timeout=60), "0")["msg_timeout"] == 60000


def test_identify_payload_extend_support_only_when_set(fqdn: str) -> None:
    assert "extend_support" not in identify_payload(Config(extend_support=False), "0")
    payload = identify_payload(Config(youzan=True, extend_support=True), "0")
    assert payload["extend_support"] is True


def test_identify_payload_carries_negotiated_features(fqdn: str) -> None:
    c = Config(tls_v1=True, deflate=True, deflate_level=3, sample_rate=25)
    payload = identify_payload(c, "0")
    assert (payload["tls_v1"], payload["snappy"], payload["deflate"]) == (True, False, True)
    assert (payload["deflate_level"], payload["sample_rate"]) == (3, 25)
    assert payload["feature_negotiation"] is True


# ------------------------------------------------------------------------------------------
# Options that only make sense together (issue 8: they failed later, on a background thread)


def test_tls_key_without_cert_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="tls_key_file needs tls_cert_file"):
        Config(tls_v1=True, tls_key_file="/etc/nsq/client.key")


def test_tls_cert_alone_is_fine_it_may_hold_the_key() -> None:
    c = Config(tls_v1=True, tls_cert_file="/etc/nsq/client.pem")
    assert (c.tls_cert_file, c.tls_key_file) == ("/etc/nsq/client.pem", None)


@pytest.mark.parametrize(
    "options",
    [
        {"tls_ca_file": "/etc/nsq/ca.pem"},
        {"tls_cert_file": "/etc/nsq/client.pem"},
        {"tls_cert_file": "c.pem", "tls_key_file": "k.pem"},
        {"tls_server_name": "nsqd.example"},
        {"tls_verify": False},
    ],
)
def test_tls_settings_without_tls_v1_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="given but tls_v1 is False: pass tls_v1=True") as exc:
        Config(**options)
    for name in options:
        assert name in str(exc.value)
    assert Config(tls_v1=True, **options).tls_v1 is True


def test_tls_verify_true_without_tls_v1_is_the_default_and_fine() -> None:
    assert Config(tls_verify=True).tls_v1 is False


def test_snappy_and_deflate_together_are_refused() -> None:
    with pytest.raises(ValueError, match="snappy and deflate cannot both be on"):
        Config(snappy=True, deflate=True)
    assert Config(snappy=True).snappy and Config(deflate=True).deflate


def test_extend_support_needs_youzan() -> None:
    with pytest.raises(ValueError, match="extend_support .* needs youzan=True"):
        Config(extend_support=True)


@pytest.mark.parametrize(
    ("options", "heartbeat"),
    [
        ({"read_timeout": 30}, "30 s"),  # the default heartbeat_interval
        ({"read_timeout": 10, "heartbeat_interval": 0}, "30 s, nsqd's default"),
        ({"heartbeat_interval": 90}, "90 s"),  # the default read_timeout is 60
    ],
)
def test_read_timeout_must_be_above_the_heartbeat(
    options: dict[str, float], heartbeat: str
) -> None:
    with pytest.raises(ValueError, match="read_timeout") as exc:
        Config(**options)
    assert f"heartbeat_interval ({heartbeat})" in str(exc.value)


def test_read_timeout_is_free_when_heartbeats_are_off_or_shorter() -> None:
    assert Config(read_timeout=5, heartbeat_interval=-1).read_timeout == 5.0
    assert Config(read_timeout=5, heartbeat_interval=2).read_timeout == 5.0


def test_replace_checks_pairs_too() -> None:
    base = Config(tls_v1=True, tls_cert_file="c.pem", tls_key_file="k.pem")
    with pytest.raises(ValueError, match="tls_key_file needs tls_cert_file"):
        base.replace(tls_cert_file=None)


# ------------------------------------------------------------------------------------------
# The "a number, not a bool" checks (nsqclient.checks), used by Config and every public call


@pytest.mark.parametrize("value", [True, False, "1", None, b"1", [1]])
def test_check_int_refuses_non_ints_naming_argument_and_unit(value: object) -> None:
    with pytest.raises(NotANumberError) as exc:
        check_int(value, "REQ delay", "milliseconds", min=0)
    assert str(exc.value) == f"REQ delay must be a non-negative int of milliseconds, not {value!r}"
    # Both a TypeError (a wrong type) and a ValueError (what the encoders always raised).
    assert isinstance(exc.value, TypeError) and isinstance(exc.value, ValueError)


def test_check_int_refuses_a_float_even_a_whole_one() -> None:
    with pytest.raises(NotANumberError, match="partition must be a non-negative int, not 2.0"):
        check_int(2.0, "partition", min=0)


@pytest.mark.parametrize(
    ("kwargs", "bad", "text"),
    [
        ({"min": 0}, -1, "count must be a non-negative int of messages, not -1"),
        ({"min": 1, "max": 65535}, 0, "count must be an int of messages (from 1 to 65535), not 0"),
        ({"min": 1, "max": 65535}, 65536, "(from 1 to 65535), not 65536"),
        ({"min": 5}, 4, "count must be an int of messages (>= 5), not 4"),
        ({"max": 5}, 6, "count must be an int of messages (<= 5), not 6"),
    ],
)
def test_check_int_ranges(kwargs: dict[str, int], bad: int, text: str) -> None:
    with pytest.raises(ValueError) as exc:
        check_int(bad, "count", "messages", **kwargs)
    assert not isinstance(exc.value, TypeError)
    assert text in str(exc.value)
    for good in (bound for bound in kwargs.values() if bound is not None):  # inclusive bounds
        assert check_int(good, "count", "messages", **kwargs) == good


@pytest.mark.parametrize("value", [True, "1.5", None, 1j])
def test_check_float_refuses_non_numbers(value: object) -> None:
    with pytest.raises(
        NotANumberError, match=f"timeout must be a positive number of seconds, not {value!r}"
    ):
        check_float(value, "timeout", "seconds", min=0, min_exclusive=True)


def test_check_float_bounds_and_conversion() -> None:
    assert check_float(3, "timeout", "seconds") == 3.0
    assert type(check_float(3, "timeout", "seconds")) is float
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, not 0$"):
        check_float(0, "timeout", "seconds", min=0, min_exclusive=True)
    assert check_float(0, "delay", "seconds", min=0) == 0.0
    with pytest.raises(
        ValueError, match=r"delay must be a number of seconds \(>= 0.001\), not 0.0001"
    ):
        check_float(0.0001, "delay", "seconds", min=0.001)
    with pytest.raises(ValueError, match=r"x must be a number \(> 1 and <= 2\), not 1$"):
        check_float(1, "x", min=1, min_exclusive=True, max=2)


def test_check_float_nan_and_infinity() -> None:
    for value in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match="finite"):
            check_float(value, "timeout", "seconds")
    assert check_float(float("inf"), "cap", "seconds", infinite=True) == float("inf")
    with pytest.raises(ValueError, match="finite"):
        check_float(float("nan"), "cap", "seconds", infinite=True)


def test_is_int_and_is_number() -> None:
    assert is_int(3) and not is_int(True) and not is_int(3.0) and not is_int("3")
    assert is_number(3) and is_number(3.5) and not is_number(False) and not is_number(None)


@pytest.mark.parametrize(
    ("make", "option", "value", "owner"),
    [
        (lambda **kw: nsqclient.Producer("127.0.0.1:4150", **kw), "max_in_flight", 5, "Consumer"),
        (lambda **kw: nsqclient.Producer("127.0.0.1:4150", **kw), "concurrency", 5, "Consumer"),
        (
            lambda **kw: nsqclient.Consumer("t", "c", print, "127.0.0.1:4150", **kw),
            "pub_timeout",
            3,
            "Producer",
        ),
        (
            lambda **kw: nsqclient.Consumer("t", "c", print, "127.0.0.1:4150", **kw),
            "leader_retries",
            1,
            "Producer",
        ),
    ],
)
def test_an_option_of_the_other_class_is_refused_naming_its_class(make, option, value, owner):
    with pytest.raises(TypeError) as info:
        make(**{option: value})
    assert f"{option} is a {owner} option" in str(info.value)


def test_every_option_says_which_class_takes_it():
    owners = {o.owner for o in OPTIONS.values()}
    assert owners == {None, "Consumer", "Producer"}
    # what both classes use stays shared
    for shared in ("dial_timeout", "tls_v1", "lookupd_poll_interval", "reconnect_interval"):
        assert OPTIONS[shared].owner is None
    check_owner({"max_in_flight": 1, "dial_timeout": 1.0}, "Consumer")
    check_owner({"pub_timeout": 1.0, "unknown_is_left_to_config": 1}, "Producer")


# ------------------------------------------------------------------------------------------
# What a type checker and help() see of the options


@pytest.mark.parametrize(
    ("options", "owner"),
    [
        (config_module.CommonOptions, "neither"),
        (config_module.ConsumerOptions, "Consumer"),
        (config_module.ProducerOptions, "Producer"),
        (config_module.ConfigOptions, None),
    ],
)
def test_the_options_typeddicts_and_the_table_cannot_drift(options, owner):
    """Each TypedDict of ``**options`` names exactly the options its class takes, each typed as
    Config's attribute, and none is required."""
    expected = [
        name
        for name, opt in OPTIONS.items()
        if owner is None or opt.owner is None or opt.owner == owner
    ]
    hints = typing.get_type_hints(options)
    assert sorted(hints) == sorted(expected)
    config_hints = typing.get_type_hints(Config)
    assert {name: hints[name] for name in expected} == {n: config_hints[n] for n in expected}
    assert options.__required_keys__ == frozenset()


@pytest.mark.parametrize(
    ("cls", "signature_of", "options"),
    [
        (nsqclient.Consumer, nsqclient.Consumer.__init__, config_module.ConsumerOptions),
        (nsqclient.Producer, nsqclient.Producer.__init__, config_module.ProducerOptions),
        (Config, Config.__init__, config_module.ConfigOptions),
        (Config, Config.replace, config_module.ConfigOptions),
    ],
)
def test_the_classes_take_their_options_as_the_typeddict(cls, signature_of, options):
    hints = typing.get_type_hints(signature_of, include_extras=True)
    assert hints["options"] == typing.Unpack[options]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("cls", "owner"),
    [(nsqclient.Consumer, "Consumer"), (nsqclient.Producer, "Producer"), (Config, None)],
)
def test_help_lists_each_option_with_type_default_unit_range_and_meaning(cls, owner):
    import pydoc

    rendered = pydoc.render_doc(cls, renderer=pydoc.plaintext)  # what help(cls) prints
    text = _flat("\n".join(line.lstrip(" |") for line in rendered.splitlines()))
    for name, opt in OPTIONS.items():
        entry = f"``{name}`` ({Config.__annotations__[name]}, default ``"
        if owner is not None and opt.owner not in (None, owner):
            assert entry not in text, name  # the other class's option is not listed
            continue
        assert entry in text, name
        assert _flat(opt.doc) in text, name
    assert "``dial_timeout`` (float, default ``1``, seconds; accepted: 0.001 to 3600)" in text
    if owner != "Producer":
        assert "``max_in_flight`` (int, default ``1``; accepted: >= 0)" in text
        assert (
            "``backoff_strategy`` (str, default ``'exponential'``; accepted: one of"
            " ``'exponential'``, ``'full_jitter'``)"
        ) in text
    if owner != "Consumer":
        assert "``pub_timeout`` (float, default ``10``, seconds; accepted: >= 0.001)" in text
