"""The GPU learner path, checked on a CPU-only machine: device choice, the install
option's requirements, and CUDA_VISIBLE_DEVICES from the workers CSV reaching each
learner rank (mpirun -x) and actor in the frontend's commands."""
import os
import re
import subprocess
import sys

from impala import devices
import sshd_fixture
from test_frontend import Run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pick_gpu_by_local_rank_or_cpu_when_none():
    assert devices.pick([], 0) == -1
    assert devices.pick(["GPU:0"], 0) == 0 and devices.pick(["GPU:0"], 1) == 0  # one GPU per rank (CSV)
    assert devices.pick(["GPU:0", "GPU:1"], 1) == 1 and devices.pick(["GPU:0", "GPU:1"], 3) == 1


def test_learner_on_cpu_when_no_gpu_is_visible_and_actor_hides_gpus():
    code = ("from impala import devices; import tensorflow as tf; lines = []; "
            "d = devices.setup_learner(0, log=lines.append); devices.hide_gpus_from_actor(); print(d); print(lines[0]); "
            "print(tf.config.get_visible_devices('GPU'))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2"))
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0] == "/CPU:0"
    assert out[1] == "[learner] no GPU visible (CUDA_VISIBLE_DEVICES=): model and update on the CPU"
    assert out[2] == "[]"


def test_gpu_requirements_differ_only_in_tensorflow():
    def pins(name):
        with open(os.path.join(ROOT, name)) as f:
            return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
    cpu, gpu = pins("requirements.txt"), pins("requirements-gpu.txt")
    assert "tensorflow-cpu==2.18.1" in cpu and "tensorflow[and-cuda]==2.18.1" in gpu
    assert [x for x in cpu if x != "tensorflow-cpu==2.18.1"] == [x for x in gpu if x != "tensorflow[and-cuda]==2.18.1"]
    with open(os.path.join(ROOT, "install.sh")) as f:
        script = f.read()
    assert "--gpu) gpu=1" in script and 'wheel_dir="$wheel_dir/gpu"' in script


def test_csv_cuda_visible_devices_reach_learner_ranks_and_actors_in_dry_run(tmp_path):
    run = Run(tmp_path)
    p = [sshd_fixture.free_port() for _ in range(4)]
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},0,,,", f"learner,127.0.0.1,{p[1]},1,,,",
                         f"actor,127.0.0.1,{p[2]},-1,,,", f"actor,127.0.0.1,{p[3]},,,,"])
    rc, out, err = run.frontend(csv, "--dry_run")
    assert rc == 0, out + err
    # one mpirun context per learner, each with its own CUDA_VISIBLE_DEVICES
    assert re.search(r"-np 1 -x CUDA_VISIBLE_DEVICES=0 -wdir .* : -np 1 -x CUDA_VISIBLE_DEVICES=1 -wdir ", out), out
    assert "learner 1 = Horovod rank 1" in out and "CUDA_VISIBLE_DEVICES=1" in out
    assert re.search(r"CUDA_VISIBLE_DEVICES=-1 \S*python\S* \S+ .*--job_name=actor --task=0", out), out
    # the same GPU for both: one context, one -x
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},0,,,", f"learner,127.0.0.1,{p[1]},0,,,",
                         f"actor,127.0.0.1,{p[2]},,,,"], name="same.csv")
    rc, out, err = run.frontend(csv, "--dry_run")
    assert rc == 0, out + err
    assert re.search(r"-np 2 -x CUDA_VISIBLE_DEVICES=0 -wdir ", out), out
    run.cleanup()
