"""Broker configuration: file, flags, and errors that name the broken setting."""

import pytest

from txbroker.broker.config import ConfigError, load_config


def test_file_then_flags(tmp_path):
    f = tmp_path / "broker.toml"
    f.write_text('data_dir = "/d"\nflush_disk_type = "SYNC_FLUSH"\n[transaction]\ncheck_interval_ms = 2000\n')
    cfg = load_config(str(f), {"listen": "0.0.0.0:1", "data_dir": None})
    assert (cfg.data_dir, cfg.flush_disk_type, cfg.listen) == ("/d", "SYNC", "0.0.0.0:1")
    assert cfg.transaction.check_interval_ms == 2000 and cfg.transaction.check_max == 15


@pytest.mark.parametrize("text,needle", [
    ('data_dir = "/d"\nrole = "boss"\n', "role"),
    ('data_dir = "/d"\nlisten = "nowhere"\n', "listen"),
    ('data_dir = "/d"\nunknown_key = 1\n', "unknown_key"),
    ('data_dir = "/d"\n[transaction]\ncheck_max = 0\n', "check_max"),
    ('data_dir = "/d"\nmax_message_size = "big"\n', "max_message_size"),
    ("data_dir = \n", "not valid TOML"),
])
def test_broken_config_names_the_setting(tmp_path, text, needle):
    f = tmp_path / "broker.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(str(f), {})


def test_data_dir_is_required():
    with pytest.raises(ConfigError, match="data_dir"):
        load_config(None, {})
