"""strata.torch's save_checkpoint under one reused tag ("last"), as a trainer that keeps only its newest checkpoint
calls it: four saves of changing weights into save_dir/last, each followed by a fresh engine (other initial
weights) that loads save_dir and must hold that save's weights bit for bit, its client_state and its step count.
Before the third save a crashed save's leftovers are in the way: strata.torch's staging directory (.last.saving: a
whole strata checkpoint, as a crash after strata's part leaves it, plus a subdirectory) and strata's own temporary
beside it (..last.saving.tmp: a partial file and a subdirectory, as a crash inside strata's part leaves it);
after every save no temporary is left and `latest` names the tag. (The bug this guards against: the second save
could not remove the replaced checkpoint because of the engine's torch_engine.pt beside strata's files, and the third
failed with EEXIST on the temporary left behind.)"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import strata.torch  # noqa: E402

CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
          "strata": {"backend": "host"}}


def new_engine(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return strata.torch.initialize(model=model, config=CONFIG, device="cpu")[0]


def first_difference(got, want):
    """(name, index, got, want) of the first element that differs bitwise, or None."""
    for name in want:
        a, b = got[name].reshape(-1), want[name].reshape(-1)
        diff = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
        if len(diff):
            i = diff[0].item()
            return name, i, a[i].item(), b[i].item()
    return None


def main():
    seed = T.seed()
    save_dir = T.scratch("py_torch_ckpt_tag")
    leftovers = [os.path.join(save_dir, ".last.saving"), os.path.join(save_dir, "..last.saving.tmp")]
    engine = new_engine(seed)
    g = torch.Generator().manual_seed(seed)
    previous = None
    for r in range(4):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        want = {k: v.clone() for k, v in engine.fp32_state_dict().items()}
        if previous is not None:
            T.check(first_difference(want, previous) is not None, "save %d: the step changed the weights" % (r + 1))
        previous = want
        if r == 2:  # a crashed save's leftovers at the temporary names
            shutil.copytree(os.path.join(save_dir, "last"), leftovers[0])
            for tmp in leftovers:
                os.makedirs(os.path.join(tmp, "sub"))
            with open(os.path.join(leftovers[1], "model.safetensors"), "wb") as f:
                f.write(b"partial")
        path = engine.save_checkpoint(save_dir, tag="last", client_state={"round": r})
        T.check(path == os.path.join(save_dir, "last"), "save %d: the path" % (r + 1), path,
                os.path.join(save_dir, "last"))
        left = sorted(os.listdir(save_dir))
        T.check(left == ["last", "latest"], "save %d: what save_dir holds (no temporary left)" % (r + 1), left,
                ["last", "latest"])
        with open(os.path.join(save_dir, "latest")) as f:
            latest = f.read()
        T.check(latest == "last", "save %d: latest names the tag" % (r + 1), latest, "last")

        fresh = new_engine(seed + 1000 + r)
        loaded, client = fresh.load_checkpoint(save_dir)
        T.check(loaded == path, "load %d: the path" % (r + 1), loaded, path)
        T.check(client == {"round": r}, "load %d: client_state" % (r + 1), client, {"round": r})
        T.check(fresh.global_steps == r + 1, "load %d: global_steps" % (r + 1), fresh.global_steps, r + 1)
        diff = first_difference(fresh.fp32_state_dict(), want)
        T.check(diff is None, "load %d: the weights of the last save, bit for bit (name, index, loaded, saved)"
                % (r + 1), diff)
        fresh.close()
    T.done()


if __name__ == "__main__":
    main()
