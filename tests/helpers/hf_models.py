"""Hugging Face transformers models as test clients: tiny random configs, their batches, and the venv that has
transformers (tools/run makes it: STRATA_HF_PYTHON, else STRATA_BUILD_DIR/venv, with Debian's torch through
--system-site-packages).

Every model is built from a seed and trained on batches made from (seed, step, micro), so a strata run and its
torch oracle see the same weights and data. The sizes are the smallest that still have every part: two layers,
heads that split, Mixtral's experts all routed to (16 tokens x 2 sequences over 4 experts, top 2)."""
import os
import subprocess
import sys

import strata_test as T

VOCAB, SEQ, BATCH = 64, 16, 2
HP = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)  # torch.optim.AdamW's and strata's
VENV_PYTHON = os.environ.get("STRATA_HF_PYTHON") or os.path.join(T.BUILD_DIR, "venv", "bin", "python")


def require_transformers():
    """transformers (its warnings off), or this process re-run under the venv that has it, or a skip that says how
    to get it."""
    try:
        import transformers
        transformers.logging.set_verbosity_error()
        return transformers
    except ImportError:
        pass
    if os.path.exists(VENV_PYTHON) and not os.environ.get("STRATA_IN_HF_VENV"):
        sys.stdout.flush()
        os.environ["STRATA_IN_HF_VENV"] = "1"  # the venv's python is a link to the same interpreter
        os.execv(VENV_PYTHON, [VENV_PYTHON] + sys.argv)
    T.skip("%s cannot import transformers, nor can %s; tools/run test makes that venv (pinned transformers from "
           "PyPI)" % (sys.executable, VENV_PYTHON))


def _configs(transformers):
    small = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64)
    llama_like = dict(small, num_key_value_heads=2, max_position_embeddings=64)
    return {
        "gpt2": (transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
                 transformers.GPT2LMHeadModel, "causal"),
        "llama": (transformers.LlamaConfig(**llama_like), transformers.LlamaForCausalLM, "causal"),
        "mistral": (transformers.MistralConfig(**llama_like, sliding_window=8), transformers.MistralForCausalLM,
                    "causal"),
        "mixtral": (transformers.MixtralConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2),
                    transformers.MixtralForCausalLM, "causal"),
        "bert": (transformers.BertConfig(**small, max_position_embeddings=64), transformers.BertForMaskedLM,
                 "masked"),
        "t5": (transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                     decoder_start_token_id=0), transformers.T5ForConditionalGeneration, "seq2seq"),
    }


NAMES = ("gpt2", "llama", "mistral", "mixtral", "bert", "t5")


def optimizer_section():
    """The config's optimizer: torch.optim.AdamW(**HP)."""
    return {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                        "weight_decay": HP["weight_decay"]}}


def build(transformers, name, seed):
    """The model `name` with weights from seed, in train mode (dropout on where the config has it)."""
    import torch
    config, cls, _ = _configs(transformers)[name]
    torch.manual_seed(seed)
    model = cls(config)
    model.train()
    return model


def batch(transformers, name, seed, step, micro):
    """The keyword arguments of one micro-batch: ids, a padded attention mask, labels."""
    import torch
    kind = _configs(transformers)[name][2]
    g = torch.Generator().manual_seed(seed * 1000003 + step * 101 + micro)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0  # the second sequence is padded on the right
    if kind == "causal":
        labels = ids.masked_fill(mask == 0, -100)
        return dict(input_ids=ids, attention_mask=mask, labels=labels)
    if kind == "masked":
        labels = torch.full_like(ids, -100)
        labels[:, ::3] = ids[:, ::3]
        return dict(input_ids=ids, attention_mask=mask, labels=labels)
    target = torch.randint(1, VOCAB, (BATCH, SEQ // 2), generator=g)
    return dict(input_ids=ids, attention_mask=mask, labels=target)


def trainer_args(transformers, out, **extra):
    """TrainingArguments for a Trainer test: the tiny batch, a log line per step, nothing saved or reported, the CPU,
    fixed seeds, no loader workers; extra sets or overrides any argument."""
    base = dict(output_dir=out, per_device_train_batch_size=BATCH, logging_steps=1, save_strategy="no", report_to=[],
                use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True)
    base.update(extra)
    return transformers.TrainingArguments(**base)


def run_mpi(np, script, *args, timeout=240):
    """Runs script as np ranks through tests/helpers/mpi.sh; (returncode, output)."""
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi.sh")
    p = subprocess.run(["bash", helper, str(np), sys.executable, script] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout
