"""KafkaSettings: where values come from (flag > environment > config file > default), the
aiokafka keyword arguments they map to, and that no error or repr ever shows a secret."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from outboxkit.outbox.config_file import ConfigFileError, use_config_file
from outboxkit.outbox.kafka_failures import describe, hosts, mask
from outboxkit.outbox.kafka_settings import KafkaSettings, KafkaSettingsError
from outboxkit.testing.certificates import make_certificates

PASSWORD = "s3cret-Pa55-never-shown"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("OUTBOXKIT_KAFKA_") or name == "OUTBOXKIT_CONFIG":
            monkeypatch.delenv(name)


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "outboxkit.toml"
    path.write_text(text)
    return path


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config(
        tmp_path,
        '[kafka]\nbootstrap = "file:9092"\nclient_id = "from-file"\nsasl_username = "file-user"\n'
        '[database]\nurl = "sqlite:///from-file.db"\n',
    )
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(path))
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", "env:9092")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_CLIENT_ID", "from-env")
    settings = KafkaSettings.load(bootstrap="flag:9092", client_id=None)
    assert settings.bootstrap == "flag:9092"  # flag
    assert settings.client_id == "from-env"  # environment over the file
    assert settings.sasl_username == "file-user"  # file over the default
    assert settings.security_protocol == "PLAINTEXT"  # default
    from outboxkit.outbox.settings import Settings

    assert Settings().db_url == "sqlite:///from-file.db"


def test_the_config_flag_beats_outboxkit_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(config(tmp_path, '[kafka]\nbootstrap = "a:1"\n')))
    chosen = tmp_path / "chosen.toml"
    chosen.write_text('[kafka]\nbootstrap = "b:2"\n')
    use_config_file(chosen)
    try:
        assert KafkaSettings().bootstrap == "b:2"
    finally:
        use_config_file(None)
    assert KafkaSettings().bootstrap == "a:1"


def test_a_typo_in_the_config_file_is_an_error_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(config(tmp_path, '[kafka]\nbootstrapp = "x"\n')))
    with pytest.raises(ConfigFileError, match=r"unknown key\(s\) in \[kafka\]: bootstrapp"):
        KafkaSettings()
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigFileError, match=r"missing\.toml"):
        KafkaSettings()


def test_sasl_ssl_scram_maps_to_aiokafka_arguments_with_a_verifying_tls_context(
    tmp_path: Path,
) -> None:
    files = make_certificates(tmp_path)
    settings = KafkaSettings.load(
        bootstrap="b1:9093,b2:9093",
        security_protocol="sasl_ssl",
        sasl_mechanism="scram-sha-512",
        sasl_username="alice",
        sasl_password=PASSWORD,
        ssl_cafile=files.ca_file,
    )
    options = settings.client_options("outboxkit-relay-1")
    context = options.pop("ssl_context")
    assert options == {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "client_id": "outboxkit-relay-1",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED


def test_mtls_loads_an_encrypted_client_key_and_a_client_id_replaces_the_roles(
    tmp_path: Path,
) -> None:
    files = make_certificates(tmp_path)
    settings = KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=files.ca_file,
        ssl_certfile=files.client_cert,
        ssl_keyfile=files.client_key,
        ssl_key_password=files.client_key_password,
        client_id="billing-prod",
    )
    options = settings.client_options("outboxkit-ops")
    assert options["client_id"] == "billing-prod"
    assert "sasl_mechanism" not in options
    wrong = settings.model_copy(update={"ssl_key_password": None})
    with pytest.raises(KafkaSettingsError, match="ssl_key_password") as caught:
        wrong.client_options("x")
    assert files.client_key_password not in str(caught.value)


def test_plaintext_has_no_tls_context_and_tls_files_without_tls_are_refused() -> None:
    assert "ssl_context" not in KafkaSettings().client_options("x")
    with pytest.raises(KafkaSettingsError, match="TLS files are set but security_protocol"):
        KafkaSettings.load(ssl_cafile=Path("/ca.pem"))


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_password": PASSWORD},
            "needs sasl_username and sasl_password",
        ),
        ({"sasl_mechanism": "PLAIN", "sasl_password": PASSWORD}, "use SASL_SSL"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "token_provider"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"sasl_mechanism": "GSSAPI", "sasl_password": PASSWORD}, "sasl_mechanism"),
    ],
)
def test_a_bad_combination_is_one_line_naming_the_setting_never_the_secret(
    given: dict[str, str], reason: str
) -> None:
    with pytest.raises(KafkaSettingsError) as caught:
        KafkaSettings.load(**given)
    message = str(caught.value)
    assert reason in message and "\n" not in message
    assert PASSWORD not in message


def test_secrets_never_show_in_repr_or_describe() -> None:
    settings = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="alice",
        sasl_password=PASSWORD,
        ssl_key_password=PASSWORD,
    )
    assert PASSWORD not in repr(settings) + str(settings) + str(settings.describe())
    assert settings.model_dump_json().count(PASSWORD) == 0
    assert mask(f"rejected {PASSWORD}\n again", settings) == "rejected *** again"


class Tokens:
    """A token provider found by import path."""

    async def token(self) -> str:
        return "t"


def test_oauthbearer_takes_a_token_provider_by_import_path() -> None:
    from aiokafka.abc import AbstractTokenProvider

    class Provider(AbstractTokenProvider):  # type: ignore[misc]
        async def token(self) -> str:
            return "t"

    globals()["PROVIDER"] = Provider
    settings = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=f"{__name__}:PROVIDER",
    )
    assert isinstance(settings.client_options("x")["sasl_oauth_token_provider"], Provider)
    wrong = settings.model_copy(update={"sasl_oauth_token_provider": f"{__name__}:Tokens"})
    with pytest.raises(KafkaSettingsError, match="not an aiokafka AbstractTokenProvider"):
        wrong.client_options("x")


def test_bootstrap_hosts_and_causes_named_from_connection_errors() -> None:
    assert hosts("a:1, b , [::1]:3") == [("a", 1), ("b", 9092), ("::1", 3)]
    settings = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password=PASSWORD,
    )
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_message = "IP address mismatch, certificate is not valid for '10.0.0.1'."
    assert describe(mismatch, "10.0.0.1", 9093, settings, 5).startswith("TLS hostname mismatch")
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    assert "certificate verify failed" in describe(untrusted, "h", 1, settings, 5)
    from aiokafka.errors import SaslAuthenticationFailed

    line = describe(SaslAuthenticationFailed("bad"), "h", 1, settings, 5)
    assert line.startswith("SASL authentication failed") and PASSWORD not in line
    assert "refused" in describe(ConnectionRefusedError(), "h", 1, settings, 5)


def test_masking_touches_only_text_from_the_error_not_the_line_we_write() -> None:
    from aiokafka.errors import SaslAuthenticationFailed

    settings = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="wrong",
    )
    line = describe(SaslAuthenticationFailed("x"), "h", 1, settings, 5)
    assert line.endswith("wrong username or password")
    assert "***" in describe(OSError("echoed wrong here"), "h", 1, settings, 5)
