"""What the fork server of `trace_all` (ddlbench.project.collectives) imports once, before it forks a
process per case: the quiet start first (a library's chatter at import is filtered as in the command
that asked for the trace), then the libraries every case imports. Imports only: nothing that
computes (OpenMP) or asks for a GPU (DeepSpeed's import probes its accelerator; a process forked
after the CUDA driver was touched cannot use it: ddlbench/launch/forked.py)."""
from ddlbench.lifecycle import quiet

quiet.install()

import torch  # noqa: E402,F401
import torchvision.models  # noqa: E402,F401
import transformers.models.gpt2.modeling_gpt2  # noqa: E402,F401
import transformers.models.llama.modeling_llama  # noqa: E402,F401

import ddlbench.models  # noqa: E402,F401
import ddlbench.project.collectives  # noqa: E402,F401
import ddlbench.rank.runner  # noqa: E402,F401
