"""The config a verl console log states, as ``run_config`` rows (analyses.config_dump), one test per
quirk of the dumps as they occur in the wild, and on the real verl logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses.config_dump import config_entries, find_dump, parse_dump
from analyses.ingest import ingest_run
from analyses.warehouse import scan_table

P = "\x1b[36m(main_task pid=54569)\x1b[0m "
DUMP = [
    "{'actor_rollout_ref': {'actor': {'clip_ratio': 0.2,",
    "                                 'optim': {'lr': 1e-06, 'min_lr_ratio': None},",
    "                                 'strategy': 'fsdp'},",
    "                       'rollout': {'n': 8, 'name': 'vllm', 'temperature': 1.0}},",
    " 'data': {'max_response_length': 512,",
    "          'train_batch_size': 256},",
    " 'trainer': {'logger': ['console', 'wandb'], 'n_gpus_per_node': 1, 'nnodes': 1}}",
]


def _entries(lines: list[str], prefix: str = P) -> dict[str, tuple[str, str]]:
    return {k: (v, s) for k, v, s in config_entries("\n".join(prefix + x for x in lines))}


def test_pprint_dump_behind_a_ray_prefix_with_ansi_colours() -> None:
    e = _entries(DUMP)
    assert e["data.max_response_length"] == ("512", "config_dump")
    assert e["actor_rollout_ref.actor.optim.lr"] == ("1e-06", "config_dump")
    assert e["actor_rollout_ref.actor.optim.min_lr_ratio"][0] == "null"
    assert e["actor_rollout_ref.rollout.name"][0] == '"vllm"'
    assert e["trainer.logger"][0] == '["console", "wandb"]'
    assert len(e) == 12


def test_another_actors_lines_inside_the_dump_are_passed_over() -> None:
    lines = [P + DUMP[0], "\x1b[36m(WorkerDict pid=55154)\x1b[0m Flash Attention 2.0 only supports {'x'", *[P + x for x in DUMP[1:]]]
    e = {k: v for k, v, _s in config_entries("\n".join(lines))}
    assert e["trainer.nnodes"] == "1" and len(e) == 12


def test_actor_output_glued_to_a_dump_line_cuts_it_and_the_lost_bracket_is_closed_by_indentation() -> None:
    # gemma-2-2b's log: "'experiment_name': 'gemma2b_function_rm',(WorkerDict pid=65860) Flash ..." and a
    # dict whose closing "}" went with the glued text
    lines = [
        "{'critic': {'model': {'fsdp_config': {'min_num_params': 0,(WorkerDict pid=65860) Flash Attention",
        "                      'path': 'google/gemma-2-2b-it'},",
        "            'ppo_micro_batch_size': 4},",
        " 'trainer': {'experiment_name': 'gemma2b_function_rm',(VGNd5CWorkerDict_0:0 WorkerDict pid=65860) Flash",
        "             'total_epochs': 15}}",
    ]
    e = {k: v for k, v, _s in config_entries("\n".join(P + x for x in lines))}
    assert e == {"critic.model.fsdp_config.min_num_params": "0", "critic.model.path": '"google/gemma-2-2b-it"',
                 "critic.ppo_micro_batch_size": "4", "trainer.experiment_name": '"gemma2b_function_rm"',
                 "trainer.total_epochs": "15"}


def test_a_long_string_pprint_wrapped_in_parentheses_is_one_value() -> None:
    d = parse_dump("{'chat_template': ('{% for m in messages %}'\n                  '{{ m.content }}{% endfor %}'),\n 'n': 2}")
    assert d == {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}", "n": 2}


def test_an_object_repr_is_kept_as_its_text() -> None:
    d = parse_dump("{'cls': <class 'verl.Worker'>, 'x': np.float64(0.3), 'tuple': (1, 2), 'neg': -3}")
    assert d == {"cls": "<class 'verl.Worker'>", "x": "np.float64(0.3)", "tuple": [1, 2], "neg": -3}


def test_command_line_overrides_when_the_log_prints_no_dump() -> None:
    head = ("command:\nbash run_gemma.sh \"trainer.n_gpus_per_node=1 data.train_batch_size=256 "
            "'trainer.logger=[console,wandb]' actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct "
            "algorithm.use_kl_in_reward=False +trainer.val_before_train=false\"\nstep:0 - timing/gen:18.9")
    e = {k: (v, s) for k, v, s in config_entries(head)}
    assert e["trainer.n_gpus_per_node"] == ("1", "command_line")
    assert e["actor_rollout_ref.model.path"][0] == '"Qwen/Qwen2.5-0.5B-Instruct"'
    assert e["algorithm.use_kl_in_reward"][0] == "false" and e["trainer.val_before_train"][0] == "false"
    assert e["trainer.logger"][0] == '"[console,wandb]"'


def test_an_unreadable_dump_gives_no_rows_and_no_error() -> None:
    assert config_entries(P + "{'a': {'b': 1 'c': 2}}") == []
    assert config_entries(P + "{'" + "{'a': " * 200) == []
    assert find_dump("no dump here\nstep:1 - a:1") is None


@pytest.mark.real_logs
def test_real_verl_logs_store_their_config(real_file, tmp_path: Path) -> None:  # noqa: ANN001
    wh = tmp_path / "wh"
    ingest_run(real_file("verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"), wh, run_id="qwen")
    ingest_run(real_file("verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log"), wh, run_id="gemma")
    ingest_run(real_file("verl/GUI-Cursor-Moving_verl_demo.log"), wh, run_id="gui")
    rc = scan_table(wh, "run_config").collect()
    got = {(r, k): v for r, k, v in rc.select("run_id", "key", "value").iter_rows()}
    assert rc.group_by("run_id").len().sort("run_id").rows() == [("gemma", 95), ("gui", 504), ("qwen", 99)]
    assert set(rc["source"]) == {"config_dump"}
    assert got["qwen", "data.max_response_length"] == got["gemma", "data.max_response_length"] == "512"
    assert (got["qwen", "data.train_batch_size"], got["gemma", "data.train_batch_size"]) == ("256", "512")
    assert got["gemma", "trainer.n_gpus_per_node"] == "2" and got["gui", "data.max_response_length"] == "20480"
    # the gemma dump's glued line: keys after it stay at their level
    assert got["gemma", "reward_model.model.path"] == '"~/models/FsfairX-LLaMA3-RM-v0.1"'
