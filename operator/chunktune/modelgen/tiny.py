"""A tiny Llama served by real vLLM with ``--load-format dummy``: no download, no weights.

vLLM's ``--load-format dummy`` builds random weights from ``config.json`` alone, but still
reads the tokenizer from the model directory. :func:`write_tiny_model` writes both: a small
Llama configuration (hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, vocab 4096,
8192 positions, bf16: the shape measured to serve on a 2-core CPU in ~25 s) and a byte-level
BPE tokenizer trained offline with the ``tokenizers`` library on a seeded synthetic word
corpus. The same spec gives byte-identical files on every run.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Special tokens, at ids 0..3 in this order.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")

#: A minimal chat template (Jinja, as transformers and vLLM read it).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + ': ' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant: ' }}{% endif %}"
)

#: Files :func:`write_tiny_model` writes; a directory holding all of them is a tiny model.
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class TinyModelSpec:
    """The shape of the tiny Llama and of its tokenizer's training corpus."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    vocab_size: int = 4096
    max_position_embeddings: int = 8192
    torch_dtype: str = "bfloat16"
    #: Seed of the synthetic corpus the tokenizer is trained on.
    seed: int = 0
    #: Sentences in that corpus.
    corpus_sentences: int = 4000

    def config(self) -> dict[str, object]:
        """The ``config.json`` vLLM and transformers read (a ``LlamaForCausalLM``)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "bos_token_id": SPECIAL_TOKENS.index("<s>"),
            "eos_token_id": SPECIAL_TOKENS.index("</s>"),
            "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
            "torch_dtype": self.torch_dtype,
            "attention_bias": False,
            "mlp_bias": False,
        }


#: The tiny model the tests and ``examples/cpu-vllm.yaml`` use.
TINY = TinyModelSpec()

_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "z", "br", "ch", "st", "tr", "pl", "sh", "th", "gr", "cl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea", "io")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck")
_PUNCT = (".", ".", ".", ",", "?", "!", ";", ":")

#: Common English words, mixed into the corpus so that ordinary English text (and the load
#: driver's synthetic prompts) encodes at about one token per word, as with a real model's
#: tokenizer.
_ENGLISH_TEXT = """
the of and to a in is it you that he was for on are with as his they be at one have this from
or had by not word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her
long make thing see him two has look more day could go come did number sound no most people my
over know water than call first who may down side been now find any new work part take get
place made live where after back little only round man year came show every good me give our
under name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also play small
end put home read hand port large spell add even land here must big high such follow act why
ask men change went light kind off need house picture try us again animal point mother world
near build self earth father head stand own page should country found answer school grow study
still learn plant cover food sun four between state keep eye never last let thought city tree
cross farm hard start might story saw far sea draw left late run while press close night real
life few north open seem together next white children begin got walk example ease paper group
always music those both mark often letter until mile river car feet care second book carry
took science eat room friend began idea fish mountain stop once base hear horse cut sure watch
color face wood main enough plain girl usual young ready above ever red list though feel talk
bird soon body dog family direct pose leave song measure door product black short numeral
class wind question happen complete ship area half rock order fire south problem piece told
knew pass since top whole king space heard best hour better true during hundred five remember
step early hold west ground interest reach fast verb sing listen six table travel less morning
ten simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall
lead cry dark machine note wait plan figure star box noun field rest correct able pound done
beauty drive stood contain front teach week final gave green oh quick develop ocean warm free
minute strong special mind behind clear tail produce fact street inch multiply nothing course
stay wheel full force blue object decide surface deep moon island foot system busy test record
boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate
hot miss brought heat snow tire bring yes distant fill east paint language among value upon
maybe slowly quickly child known board spend field been behind can close early toward much
across almost along already around because being below beyond called film heart inside into
its later level market model month offer outside party price quite rather report share simply
speak team today used within without years
"""
ENGLISH = tuple(_ENGLISH_TEXT.split())


def corpus(seed: int, sentences: int) -> Iterator[str]:
    """Seeded synthetic text: pronounceable Zipf-distributed words and common English words,
    digits, punctuation."""
    rng = random.Random(seed)
    lexicon = []
    for _ in range(3000):
        syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        lexicon.append("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                               for _ in range(syllables)))
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    for i in range(sentences):
        if i % 2:  # every other sentence is English (uniform over the common words)
            words = rng.choices(ENGLISH, k=rng.randint(4, 24))
        else:
            words = rng.choices(lexicon, weights, k=rng.randint(4, 24))
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        words[0] = words[0].capitalize()
        yield " ".join(words) + rng.choice(_PUNCT)


def build_tokenizer(spec: TinyModelSpec = TINY):  # type: ignore[no-untyped-def]
    """Train the byte-level BPE tokenizer (a ``tokenizers.Tokenizer``) for ``spec``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(spec.seed, spec.corpus_sentences), trainer=trainer)
    return tok


def _tokenizer_config(spec: TinyModelSpec) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }


def _dump(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_tiny_model(directory: str | Path, spec: TinyModelSpec = TINY) -> Path:
    """Write the tiny model into ``directory`` (created if missing) and return its path.

    Existing files of the same names are replaced; other files are left alone. The output is
    deterministic: the same ``spec`` writes the same bytes.
    """
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(spec)
    if tok.get_vocab_size() > spec.vocab_size:  # pragma: no cover - trainer invariant
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids > {spec.vocab_size}")
    files = {
        "config.json": _dump(spec.config()),
        # tokenizers' own serialization is deterministic for a deterministic training run.
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": _dump(_tokenizer_config(spec)),
        "special_tokens_map.json": _dump({"bos_token": "<s>", "eos_token": "</s>",
                                          "unk_token": "<unk>", "pad_token": "<pad>"}),
    }
    for name, text in files.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)
    return out


def is_tiny_model_dir(directory: str | Path) -> bool:
    """True when ``directory`` holds every file :func:`write_tiny_model` writes."""
    d = Path(directory)
    return d.is_dir() and all((d / name).is_file() for name in FILES)


def digest(directory: str | Path) -> str:
    """SHA-256 over the model files (name and bytes), to compare two written models."""
    h = hashlib.sha256()
    for name in FILES:
        h.update(name.encode())
        h.update((Path(directory) / name).read_bytes())
    return h.hexdigest()
