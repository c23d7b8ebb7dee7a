"""transformers' side of tests/test_models.py, run in .venv-transformers:

    python tests/_models_reference.py JOB.json

JOB.json: {"tasks": [{"name", "folder", "gguf_file" (or null), "tokens" ([B, T] ids, or null),
"messages", "texts", "save_tokenizer" (a folder; each optional)}], "out": "result.npz"}. For each task
the npz holds `{name}.logprobs` (float32 [B, T, V] log-softmax of the logits at every position,
float32 weights), with messages `{name}.chat_ids` (apply_chat_template(..., add_generation_prompt=True)
ids), with texts `{name}.text_ids.{i}` (ids without special tokens added); save_tokenizer writes
the tokenizer there with save_pretrained.
"""

import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(job_path):
    job = json.loads(open(job_path).read())
    out = {}
    torch.manual_seed(0)
    for task in job["tasks"]:
        kwargs = {"gguf_file": task["gguf_file"]} if task.get("gguf_file") else {}
        if task.get("messages") or task.get("texts") or task.get("save_tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(task["folder"], **kwargs)
        if task.get("messages"):
            ids = tokenizer.apply_chat_template(task["messages"], add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            out[f"{task['name']}.chat_ids"] = np.asarray(ids, np.int64)
        for i, text in enumerate(task.get("texts") or []):
            out[f"{task['name']}.text_ids.{i}"] = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int64)
        if task.get("save_tokenizer"):
            tokenizer.save_pretrained(task["save_tokenizer"])
        if task.get("tokens") is not None:
            model = AutoModelForCausalLM.from_pretrained(task["folder"], dtype=torch.float32, **kwargs).eval()
            with torch.no_grad():
                logits = model(torch.tensor(task["tokens"], dtype=torch.long)).logits.float()
            out[f"{task['name']}.logprobs"] = torch.log_softmax(logits, dim=-1).numpy()
    np.savez(job["out"], **out)


if __name__ == "__main__":
    main(sys.argv[1])
