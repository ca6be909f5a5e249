"""Run a short tiny-model training and dump the loss history; launched both plainly and under
`accelerate launch --num_processes 2 --cpu` by tests/test_training.py."""

import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _tiny import target_records, tiny_target

from hf_dspark.training.trainer import TrainConfig, train

if __name__ == "__main__":
    torch.set_num_threads(1)
    out = sys.argv[1]
    t = tiny_target()
    recs = target_records(t, 24, resp_len=24)
    cfg = TrainConfig(data="", output_dir=out + ".run", num_layers=1, markov_rank=8, batch_size=8, num_anchors=4,
                      max_steps=4, val_size=0, eval_every=0, save_every=0, lr=3e-3)
    res = train(cfg, target=t, records=recs)
    from accelerate import PartialState

    if PartialState().is_main_process:
        with open(out, "w") as f:
            json.dump({"processes": PartialState().num_processes, "loss": [h["loss"] for h in res["history"]]}, f)
    PartialState().destroy_process_group()  # a gloo group left for interpreter exit can abort a worker
