"""``temper``'s argument parsing: config files and overrides may come before, between and
after the flags, in every command that takes them; unknown flags are still refused."""

import pytest

from tempering.cli import build_parser


@pytest.mark.parametrize("argv, field, expected", [
    (["train", "steps=1", "--quiet", "rollout.group_size=2"], "config_and_overrides",
     ["steps=1", "rollout.group_size=2"]),
    (["train", "my.yaml", "--run-dir", "r", "steps=1", "--quiet", "seed=3"], "config_and_overrides",
     ["my.yaml", "steps=1", "seed=3"]),
    (["pretrain", "steps=1", "--force", "seed=3"], "config_and_overrides", ["steps=1", "seed=3"]),
    (["explain", "a.yaml", "--probe", "0", "seed=3"], "config_and_overrides", ["a.yaml", "seed=3"]),
    (["sft", "data.jsonl", "--quiet", "sft.epochs=2"], "items", ["data.jsonl", "sft.epochs=2"]),
    (["eval", "builtin:tiny", "--n", "4", "seed=3", "--quiet", "quickstart"], "inputs",
     ["builtin:tiny", "seed=3", "quickstart"]),
    (["serve", "M", "--port", "8001", "threads=1"], "inputs", ["M", "threads=1"]),
])
def test_items_after_a_flag_join_the_commands_items(argv, field, expected):
    assert getattr(build_parser().parse_args(argv), field) == expected


@pytest.mark.parametrize("argv, unknown", [
    (["train", "steps=1", "--nosuch", "seed=3"], "--nosuch"),
    (["report", "run", "--out", "r.html", "extra"], "extra"),
    (["sandbox", "run", "p.py", "--json", "extra"], "extra"),
])
def test_unknown_flags_and_items_a_command_does_not_take_are_refused(argv, unknown, capsys):
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    assert f"unrecognized arguments: {unknown}" in capsys.readouterr().err


def test_a_resumed_run_takes_new_server_addresses_and_refuses_every_other_override(tmp_path):
    """Servers restarted elsewhere (or a Ray cluster at a new address) must not strand a run:
    ``--resume`` takes where they are now; what the run computes stays the saved config's."""
    from tempering.cli import _resumed_config
    from tempering.config import ConfigError, TrainConfig, save_resolved

    run = tmp_path / "run"
    run.mkdir()
    save_resolved(TrainConfig(steps=7, rollout={"server": {"url": "http://10.0.0.1:8000"}}), run / "config.yaml")
    args = build_parser().parse_args(["train", "--resume", str(run), "rollout.server.url=[http://a:1,http://b:2]",
                                      "pipeline.ray_address=10.0.0.9:6379"])
    config = _resumed_config(args, args.config_and_overrides, movable=("rollout.server.url", "pipeline.ray_address"))
    assert config.rollout.server.url == ["http://a:1", "http://b:2"] and config.pipeline.ray_address == "10.0.0.9:6379"
    assert config.steps == 7 and config.run_dir == str(run)
    for other in (["steps=9"], ["my.yaml"], ["rollout.server.url=http://a:1", "learner.lr=1"]):
        args = build_parser().parse_args(["train", "--resume", str(run), *other])
        with pytest.raises(ConfigError, match="rollout.server.url, pipeline.ray_address"):
            _resumed_config(args, args.config_and_overrides, movable=("rollout.server.url", "pipeline.ray_address"))


def test_a_resumed_run_that_sampled_in_its_own_process_is_not_moved_onto_a_server(tmp_path):
    """A server address given to a run that had none would change what it computes (another
    sampler); the refusal says so and what to do, not how the config's sections nest."""
    from tempering.cli import _resumed_config
    from tempering.config import ConfigError, TrainConfig, save_resolved

    run = tmp_path / "run"
    run.mkdir()
    save_resolved(TrainConfig(steps=7), run / "config.yaml")
    args = build_parser().parse_args(["train", "--resume", str(run), "rollout.server.url=http://a:1"])
    with pytest.raises(ConfigError, match="sampled in its own process.*start a new run"):
        _resumed_config(args, args.config_and_overrides, movable=("rollout.server.url", "pipeline.ray_address"))
