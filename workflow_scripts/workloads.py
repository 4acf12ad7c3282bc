"""The models the study trains, declared once: their family, input, head, analytic
FLOPs, rough memory and compile cost.

A :class:`Workload` is all the host needs to know of a model (the ``model`` field's
values, the estimate of a study's time and memory, the report's families); the rank
side builds it (``rank/models.py``). Two families:

- ``vision``: image classification on ``image_size`` x ``image_size`` inputs
  (torchvision's ResNets from scratch, the article's small CNN);
- ``text``: Hugging Face ``transformers`` models built from the configuration below
  (the named architecture's sizes, random initial weights, nothing downloaded), on
  ``seq_len`` tokens: BERT for sequence classification (the Accelerate CPU guide's
  example), GPT-2 for causal-LM fine-tuning, and tiny variants of both for quick runs.

Standard library only (read on both sides of the process boundary). Adding a model is
one entry in :data:`WORKLOADS` (see docs/extending.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

FAMILIES = ("vision", "text")


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    family: str
    #: ``image-classification``, ``sequence-classification`` or ``causal-lm``
    task: str
    help: str
    #: classes of the head (vision, sequence classification); causal-LM: the vocabulary
    num_classes: int
    #: rough training memory: (fixed MB: weights, gradients, momentum, the framework;
    #: MB per sample at the reference input size: activations kept for the backward)
    memory_mb: tuple[float, float]
    #: inductor's one-off cold compile on 2 cores (seconds)
    compile_s: float
    #: text: the default sequence length (the reference input size of ``memory_mb``)
    seq_len: int | None = None
    #: text: the transformers model class and its configuration's keyword arguments
    hf_class: str | None = None
    hf_config: Mapping[str, Any] | None = None
    #: vision: FLOPs of one forward pass at 224 x 224 (None: computed by ``_cnn_flops``)
    forward_flops_224: float | None = None
    #: vision: the smallest image size it takes (0: any), and the size at or below
    #: which its last feature maps are 1x1, where batch norm has one value per channel
    #: at batch 1 and cannot train (0: no batch norm)
    min_image_size: int = 0
    batch_norm_1x1_at: int = 0

    @property
    def text(self) -> bool:
        return self.family == "text"

    def input_scale(self, spec: Mapping) -> float:
        """The spec's input size over the reference one (pixels, or tokens)."""
        if self.text:
            return int(spec.get("seq_len") or self.seq_len) / self.seq_len
        return (int(spec.get("image_size") or 224) / 224) ** 2

    def forward_flops(self, spec: Mapping) -> float:
        """FLOPs of one sample's forward pass: 2 per multiply-add of the matmuls and
        convolutions (norms, activations and softmax are not counted), as
        ``FlopCounterMode`` counts them."""
        if self.text:
            return _transformer_flops(self, int(spec.get("seq_len") or self.seq_len))
        size = int(spec.get("image_size") or 224)
        if self.forward_flops_224 is None:
            return _cnn_flops(size)
        return self.forward_flops_224 * (size / 224) ** 2

    def memory_estimate_mb(self, spec: Mapping) -> tuple[float, float]:
        """(fixed MB, activations MB for the spec's batch and input size)."""
        fixed, per_sample = self.memory_mb
        return fixed, per_sample * spec["batch_size"] * self.input_scale(spec)


def _cnn_flops(s: int) -> float:
    """rank/models.SmallCNN: three 3x3 convolutions, two max-pools, two linears."""
    convs = 2 * 9 * (3 * 32 * s * s + 32 * 64 * (s // 2) ** 2 + 64 * 64 * (s // 4) ** 2)
    return float(convs + 2 * (64 * 16 * 128 + 128 * 10))


def _transformer_flops(w: Workload, s: int) -> float:
    """Per token and layer: the Q, K, V and output projections (8 h^2), the MLP
    (4 h i) and attention's two matmuls over the s positions (4 s h); then the head:
    BERT's pooler and classifier on the first token, GPT-2's tied LM head on every
    token (2 h V)."""
    c = w.hf_config
    if w.hf_class == "GPT2LMHeadModel":
        h, layers, inner = c["n_embd"], c["n_layer"], c.get("n_inner") or 4 * c["n_embd"]
        head = s * 2 * h * c["vocab_size"]
    else:
        h, layers, inner = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
        head = 2 * h * h + 2 * h * w.num_classes
    return float(s * layers * (8 * h * h + 4 * h * inner + 4 * s * h) + head)


#: Dropout off in a transformer the study builds unless its spec says ``dropout: true``
#: (the model's own, as users fine-tune): with it, a compiled run (or any run that draws
#: its random numbers otherwise) trains another trajectory from the same seed, and its
#: losses match eager's only within what dropout's noise allows. The gradient check's
#: references are always built without it (their step runs without it too).
NO_DROPOUT = {
    "bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}


def with_dropout(hf_config: dict) -> dict:
    """A transformers config without the study's dropout overrides: the model's own."""
    off = {k for family in NO_DROPOUT.values() for k in family}
    return {k: v for k, v in hf_config.items() if k not in off}


def _bert(name: str, help: str, memory_mb, compile_s, **config) -> Workload:
    # MRPC: 2 labels
    # problem_type set: else the first forward with labels sets it, and a compiled model
    # recompiles at the second step
    config = {
        "num_labels": 2,
        "max_position_embeddings": 512,
        "problem_type": "single_label_classification",
        **NO_DROPOUT["bert"],
        **config,
    }
    return Workload(
        name, "text", "sequence-classification", help, 2, memory_mb, compile_s,
        seq_len=128, hf_class="BertForSequenceClassification", hf_config=config,
    )  # fmt: skip


def _gpt2(name: str, help: str, memory_mb, compile_s, seq_len: int, **config) -> Workload:
    vocab = config.get("vocab_size", 50257)
    config = {"bos_token_id": vocab - 1, "eos_token_id": vocab - 1, **NO_DROPOUT["gpt2"], **config}
    return Workload(
        name, "text", "causal-lm", help, vocab, memory_mb, compile_s,
        seq_len=seq_len, hf_class="GPT2LMHeadModel", hf_config=config,
    )  # fmt: skip


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "resnet50", "vision", "image-classification",
            "torchvision ResNet-50 from scratch (1000-way head, labels index % 10)",
            1000, (600.0, 110.0), 75.0, forward_flops_224=2 * 4.09e9,
            min_image_size=32, batch_norm_1x1_at=32,
        ),
        Workload(
            "resnet18", "vision", "image-classification", "torchvision ResNet-18 from scratch",
            1000, (350.0, 40.0), 45.0, forward_flops_224=2 * 1.81e9,
            min_image_size=32, batch_norm_1x1_at=32,
        ),
        Workload(
            "cnn", "vision", "image-classification",
            "the article's small CIFAR-style CNN (10 classes)", 10, (300.0, 4.0), 25.0,
        ),
        _bert(
            "bert-base", "BERT-base (bert-base-cased's sizes: 110 M parameters) for sequence "
            "classification, as in Accelerate's NLP example", (1700.0, 120.0), 60.0,
            vocab_size=28996, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072,
        ),
        _bert(
            "bert-tiny", "BERT-Tiny (2 layers, hidden 128, 2 heads: Google's "
            "bert_uncased_L-2_H-128_A-2 sizes) for sequence classification",
            (350.0, 2.0), 30.0, vocab_size=30522, hidden_size=128, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=512,
        ),
        _gpt2(
            "gpt2", "GPT-2 small (124 M parameters) for causal-LM fine-tuning",
            (1900.0, 450.0), 70.0, 256, vocab_size=50257, n_positions=1024, n_embd=768,
            n_layer=12, n_head=12,
        ),
        _gpt2(
            "gpt2-tiny", "a tiny GPT-2 (2 layers, hidden 128, 2 heads, 8192-token vocabulary) "
            "for causal-LM fine-tuning", (350.0, 10.0), 30.0, 128, vocab_size=8192,
            n_positions=512, n_embd=128, n_layer=2, n_head=2,
        ),
    )
}  # fmt: skip


def estimated_memory_mb(spec: dict) -> float:
    """A rough training-memory model, for the memory warning and a SLURM job's request
    (the model's ``memory_mb`` in :data:`WORKLOADS`: weights, gradients, momentum and
    the framework, plus the activations kept for the backward pass); an order of
    magnitude, not a measurement."""
    w = WORKLOADS.get(spec["model"], WORKLOADS["resnet50"])
    fixed, activations = w.memory_estimate_mb(spec)
    workers = spec["num_workers"] if spec["data"] != "synthetic" else 0
    return fixed * (1 + 0.5 * workers) + activations


def names() -> list[str]:
    return list(WORKLOADS)


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(WORKLOADS)}") from None


def libraries(name: str) -> tuple[str, ...]:
    """The modules a run of model ``name`` imports to build it (after torch): its
    library, and a transformers model's class (``module:attribute`` loads an
    attribute: transformers imports a model's module when its class is first asked
    for); none for the study's own small CNN."""
    w = get(name)
    if w.text:
        return ("transformers", f"transformers:{w.hf_class}")
    return () if name == "cnn" else ("torchvision.models",)


def import_libraries(modules) -> None:
    """Import ``modules`` (:func:`libraries`'s form)."""
    import importlib

    for name in modules:
        module, _, attribute = name.partition(":")
        loaded = importlib.import_module(module)
        if attribute:
            getattr(loaded, attribute)


#: ``data: keywords``, the study's learnable text-classification task, generated (no
#: text data set ships inside a package installable here: scikit-learn's 20 newsgroups,
#: NLTK's corpora and Hugging Face datasets all download at run time). Each sequence is
#: ``seq_len`` background tokens (drawn from KEYWORDS_BACKGROUND token ids) holding one
#: keyword of EVERY class at distinct random positions (KEYWORDS_PER_CLASS token ids per
#: class, fixed by the task's seed); its label is the class whose keyword comes FIRST.
#: Which keywords a sequence holds says nothing of its label (a bag of words scores
#: chance): the model has to learn where they are, i.e. attention with positions. The
#: same KEYWORDS_TRAIN / KEYWORDS_TEST split for every run (the spec's seed shuffles
#: and initialises).
KEYWORDS_SEED = 12345
KEYWORDS_PER_CLASS = 8
KEYWORDS_TRAIN = 2048
KEYWORDS_TEST = 512
#: token ids below this are never drawn (BERT's special and unused tokens)
KEYWORDS_FIRST_TOKEN = 1000
#: how many distinct background token ids the sequences draw from (from
#: KEYWORDS_FIRST_TOKEN on; the keywords are drawn above them)
KEYWORDS_BACKGROUND = 64


# --------------------------------------------------------------------------- training
#: How each family trains when the spec leaves it to the model (``optimizer``, ``lr``,
#: ``lr_schedule``, ``lr_warmup_steps`` null): vision as the article (SGD with momentum
#: 0.9, lr 0.01, constant); text as Hugging Face's fine-tuning examples (Accelerate's
#: nlp_example: torch's AdamW, lr 2e-5, its default weight decay 0.01, a linear schedule
#: with 100 warm-up steps, decaying to 0 at the end of the run).
TRAINING_DEFAULTS = {
    "vision": {"optimizer": "sgd", "lr": 0.01, "lr_schedule": "constant", "lr_warmup_steps": 0},
    "text": {"optimizer": "adamw", "lr": 2e-5, "lr_schedule": "linear", "lr_warmup_steps": 100},
}
#: Whether a family's step clears the gradients last (Hugging Face's examples:
#: ``optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()``) or first (the
#: article's loop). The same work, but not the same allocations: on BERT-base (batch 8,
#: fp32, 2 cores) clearing them last took 2.6x the page faults and 5 % more time a step.
ZERO_GRAD_LAST = {"vision": False, "text": True}
#: the optimizers' hyper-parameters besides the learning rate (torch's defaults, SGD's
#: momentum the article's)
OPTIMIZER_ARGS = {"sgd": {"momentum": 0.9}, "adamw": {}}


# --------------------------------------------------------------------------- padding
#: ``padding: dynamic``: each sample's real length is drawn from a fixed distribution
#: shaped like MRPC's sentence pairs under bert-base-cased's tokenizer (mean ~41 % of the
#: longest, spread ~12 %), relative to the spec's ``seq_len`` (the longest a sample may
#: be): round(N(PAD_MEAN * seq_len, PAD_STD * seq_len)), clipped to
#: [max(2, PAD_MIN * seq_len), seq_len]; each batch is padded to its longest sample
#: (as a collator with ``padding="longest"`` does), its attention mask zero on the pads.
PAD_MEAN, PAD_STD, PAD_MIN = 0.41, 0.12, 0.12
PAD_SEED = 424242


def sample_lengths(seq_len: int, n: int, seed: int) -> list[int]:
    """``n`` real sample lengths for ``padding: dynamic`` (pure Python: the estimate
    draws the same ones as the ranks)."""
    import random

    rng = random.Random(PAD_SEED * 1_000_003 + seed)
    low = max(2, round(PAD_MIN * seq_len))
    return [
        min(seq_len, max(low, round(rng.gauss(PAD_MEAN * seq_len, PAD_STD * seq_len))))
        for _ in range(n)
    ]


def expected_padded_length(seq_len: int, batch_size: int, draws: int = 256) -> float:
    """The mean length a batch of ``batch_size`` dynamically padded samples is padded
    to (its longest sample), over ``draws`` batches of the distribution above."""
    lengths = sample_lengths(seq_len, draws * batch_size, 0)
    longest = [max(lengths[i : i + batch_size]) for i in range(0, len(lengths), batch_size)]
    return sum(longest) / len(longest)
