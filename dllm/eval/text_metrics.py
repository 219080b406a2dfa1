"""ParallelBench Text Writing metrics and the external components they need.

Three metrics, one sample each, every result carrying `"headline"` = `grammar`:

    sentence_to_words_score   W2S: inclusion (substring, case-sensitive), grammar; v1 score = AND
    summary_score             SAMSum: ROUGE-1/2/L F-measures, grammar; v1 score = rougeL × grammar
    paraphrase_score          paraphrases: 1 − BLEU, BERTScore F1, grammar; v1 score = product

Pure parts (inclusion, ROUGE via `rouge-score`, BLEU via `sacrebleu`) are always computed. Grammar
and BERTScore come from pluggable backends held in `Backends`:

* grammar: a `GrammarChecker`; `LanguageToolChecker` talks to a LanguageTool server through
  `language_tool_python`. `grammar_checker()` connects to the URL given or to the one in the
  environment variable `DLLM_LANGUAGETOOL_URL`; a local install is used only with
  `allow_local=True` (and never downloaded), the public LanguageTool API only with
  `public_api=True`.
* BERTScore: a `BertScorer` over local roberta-large weights, through the optional `bert_score`
  package.

A missing backend makes its component *unavailable*: the value is None, which is distinct from 0
and is never replaced by a heuristic. `score_v1` is None whenever a part it needs is None. An
empty (whitespace-only) prediction fails the grammar check by definition, so its grammar is 0.0
with or without a backend.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_LANGUAGETOOL_URL = "DLLM_LANGUAGETOOL_URL"
PUBLIC_API_URL = "https://api.languagetool.org"
LANGUAGE = "en-US"
# BERTScore with lang="en" defaults: roberta-large, layer 17, no idf, no baseline rescaling.
BERTSCORE_LAYER = 17


# ----------------------------------------------------------------------------------------------
# Grammar backends
# ----------------------------------------------------------------------------------------------

class GrammarChecker:
    """A grammar backend: `check(text)` is True iff the stripped text is non-empty and the
    checker reports zero matches of any kind (grammar, spelling, punctuation, typography,
    whitespace, style).

    Subclasses implement `matches(text)` (the list of issues found in a non-empty text) or
    override `check`. `name`, `version` and `source` identify the backend in result rows.
    """

    name: str = "grammar"
    version: str | None = None
    source: str | None = None

    def check(self, text: str) -> bool:
        """True iff `text.strip()` is non-empty and has no issue at all."""
        text = text.strip()
        return bool(text) and len(self.matches(text)) == 0

    def matches(self, text: str) -> Sequence:
        """The issues found in `text` (any sequence; only its length matters to `check`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement matches() or check()")


class LanguageToolChecker(GrammarChecker):
    """LanguageTool (`en-US`, default rules) through `language_tool_python`.

    Build one with `connect(url)` for a running server (local or, on explicit request, the public
    API) or `local_install()` for an already installed LanguageTool; neither downloads anything.
    `version` is the LanguageTool version the server reports.
    """

    name = "languagetool"

    def __init__(self, tool, *, version: str | None, source: str):
        self._tool = tool
        self.version = version
        self.source = source

    def matches(self, text: str) -> Sequence:
        return self._tool.check(text)

    @classmethod
    def connect(cls, url: str, *, timeout: float = 5.0) -> "LanguageToolChecker":
        """Connect to the LanguageTool HTTP server at `url` (with or without the `/v2` suffix).

        Raises (ConnectionError, ValueError, ...) if the server does not answer like LanguageTool.
        """
        import language_tool_python
        import requests

        base = normalize_server_url(url)
        response = requests.post(f"{base}/v2/check", data={"language": LANGUAGE, "text": "Hello."}, timeout=timeout)
        response.raise_for_status()
        try:
            software = response.json().get("software", {})
        except ValueError as err:
            raise ValueError(f"{base}/v2/check did not return JSON; is this a LanguageTool server?") from err
        if not isinstance(software, Mapping) or "version" not in software:
            raise ValueError(f"{base}/v2/check answered without a 'software' version; is this a LanguageTool server?")
        # The trailing slash keeps a path prefix (`http://host/lt/`) when the wrapper appends `v2/`.
        tool = language_tool_python.LanguageTool(LANGUAGE, remote_server=base + "/")
        return cls(tool, version=str(software["version"]), source=base)

    @classmethod
    def local_install(cls) -> "LanguageToolChecker":
        """Start a server from the newest LanguageTool already installed for `language_tool_python`.

        Raises RuntimeError when nothing is installed: downloads stay disabled. Needs a JDK.
        """
        import language_tool_python
        from language_tool_python.download_lt import LocalLanguageTool
        from language_tool_python.utils import get_language_tool_download_path

        installed = LocalLanguageTool.get_latest_installed_version()
        if installed is None:
            raise RuntimeError(f"no LanguageTool installed under {get_language_tool_download_path()} "
                               f"(downloads are disabled)")
        # An installed version makes the wrapper's download step a no-op.
        tool = language_tool_python.LanguageTool(LANGUAGE, language_tool_download_version=installed.version_name)
        return cls(tool, version=installed.version_name, source="local")


def normalize_server_url(url: str) -> str:
    """`localhost:8081`, `http://localhost:8081/` and `http://localhost:8081/v2/` all become
    `http://localhost:8081` (scheme added when missing, trailing slash and `/v2` removed)."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"LanguageTool URL must be a non-empty string, got {url!r}")
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if url.endswith("/v2"):
        url = url[: -len("/v2")]
    return url


_CHECKERS: dict[str, GrammarChecker] = {}   # successful connections, by normalised URL or "local"


def resolve_grammar(url: str | None = None, *, public_api: bool = False, allow_local: bool = False,
                    timeout: float = 5.0) -> tuple[GrammarChecker | None, str | None]:
    """Find a grammar backend: `(checker, None)` on success, `(None, reason)` otherwise.

    Order: the `url` argument, else `$DLLM_LANGUAGETOOL_URL`; without either, the public API if
    `public_api`, else a local install if `allow_local`. A configured server that does not answer
    gives a RuntimeWarning naming the URL and no fallback. Never raises on absence; successful
    checkers are cached per URL.
    """
    if url is not None and not url.strip():
        url = None
    if url is None:
        url = os.environ.get(ENV_LANGUAGETOOL_URL, "").strip() or None
    if url is None and public_api:
        url = PUBLIC_API_URL
    if url is not None:
        key = normalize_server_url(url)
        if key not in _CHECKERS:
            try:
                _CHECKERS[key] = LanguageToolChecker.connect(key, timeout=timeout)
            except Exception as err:  # noqa: BLE001 - any failure means "unavailable", reported with its cause
                reason = f"LanguageTool server at {key} did not answer: {type(err).__name__}: {err}"
                warnings.warn(f"{reason}; grammar scores will be reported as unavailable", RuntimeWarning,
                              stacklevel=2)
                return None, reason
        return _CHECKERS[key], None
    if allow_local:
        if "local" not in _CHECKERS:
            try:
                _CHECKERS["local"] = LanguageToolChecker.local_install()
            except Exception as err:  # noqa: BLE001
                return None, f"local LanguageTool unavailable: {type(err).__name__}: {err}"
        return _CHECKERS["local"], None
    return None, (f"no grammar backend configured: set {ENV_LANGUAGETOOL_URL} to a LanguageTool server URL "
                  f"(or allow a local install / the public API explicitly)")


def grammar_checker(url: str | None = None, *, public_api: bool = False, allow_local: bool = False,
                    timeout: float = 5.0) -> GrammarChecker | None:
    """The grammar backend, or None when none is configured or the server does not answer.

    See `resolve_grammar` for the lookup order; `grammar_unavailable_reason` says why it is None.
    """
    return resolve_grammar(url, public_api=public_api, allow_local=allow_local, timeout=timeout)[0]


def grammar_unavailable_reason(url: str | None = None, *, public_api: bool = False, allow_local: bool = False,
                               timeout: float = 5.0) -> str | None:
    """Why `grammar_checker` with the same arguments returns None; None when a backend is available."""
    return resolve_grammar(url, public_api=public_api, allow_local=allow_local, timeout=timeout)[1]


# ----------------------------------------------------------------------------------------------
# BERTScore backend
# ----------------------------------------------------------------------------------------------

class BertScorer:
    """BERTScore F1 with the `lang="en"` defaults (roberta-large, layer 17, no idf, no baseline
    rescaling), from local weights.

    model_path: a local roberta-large directory (Hugging Face layout). Construction raises
    ImportError when the optional `bert_score` package is missing and FileNotFoundError when the
    path does not exist (OSError/ValueError from `transformers` for unreadable weights);
    `bert_scorer()` turns all of these into "unavailable".
    """

    name = "bert_score"

    def __init__(self, model_path: str | os.PathLike, *, device: str | None = None, batch_size: int = 64):
        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(f"BERTScore model directory {str(path)!r} does not exist "
                                    f"(expected local roberta-large weights)")
        import bert_score  # optional dependency, imported only when asked for

        self._scorer = bert_score.BERTScorer(
            model_type=str(path), num_layers=BERTSCORE_LAYER, lang="en", idf=False,
            rescale_with_baseline=False, device=device, batch_size=batch_size,
        )
        self.version = getattr(bert_score, "__version__", None)
        self.source = str(path)

    def score(self, candidate: str, reference: str) -> float:
        """BERTScore F1 of `candidate` against the single `reference`."""
        _, _, f1 = self._scorer.score([candidate], [reference])
        return float(f1[0])


def resolve_bertscore(model_path: str | os.PathLike | None = None, **kwargs) -> tuple[BertScorer | None, str | None]:
    """`(scorer, None)`, or `(None, reason)` when no path is given, the path is missing or the
    `bert_score` package is not installed. Never raises on absence."""
    if model_path is None:
        return None, "no BERTScore model path given (local roberta-large weights are required)"
    try:
        return BertScorer(model_path, **kwargs), None
    except (ImportError, OSError, ValueError) as err:   # missing package, path or weights
        return None, f"BERTScore unavailable: {type(err).__name__}: {err}"


def bert_scorer(model_path: str | os.PathLike | None = None, **kwargs) -> BertScorer | None:
    """A `BertScorer`, or None when it cannot be built (see `resolve_bertscore`)."""
    return resolve_bertscore(model_path, **kwargs)[0]


# ----------------------------------------------------------------------------------------------
# The backends bundle
# ----------------------------------------------------------------------------------------------

@dataclass
class Backends:
    """External components for the Text Writing metrics; a None field is unavailable.

    grammar / bertscore:           the backends.
    grammar_reason / bertscore_reason: why a backend is None (for reports), optional.
    """

    grammar: GrammarChecker | None = None
    bertscore: BertScorer | None = None
    grammar_reason: str | None = None
    bertscore_reason: str | None = None

    @classmethod
    def resolve(cls, grammar_url: str | None = None, *, public_api: bool = False, allow_local: bool = False,
                bertscore_model: str | os.PathLike | None = None) -> "Backends":
        """Look up both backends (`resolve_grammar`, `resolve_bertscore`), keeping the reasons."""
        grammar, grammar_reason = resolve_grammar(grammar_url, public_api=public_api, allow_local=allow_local)
        scorer, scorer_reason = resolve_bertscore(bertscore_model)
        return cls(grammar, scorer, grammar_reason, scorer_reason)

    def describe(self) -> dict:
        """Backend names, versions and sources for result rows; "unavailable" with the reason when absent."""
        out = {}
        for field, backend, reason in (("grammar", self.grammar, self.grammar_reason),
                                       ("bertscore", self.bertscore, self.bertscore_reason)):
            if backend is None:
                out[field] = "unavailable"
                out[f"{field}_version"] = None
                out[f"{field}_source"] = None
                out[f"{field}_unavailable_reason"] = reason or f"no {field} backend given"
            else:
                out[field] = getattr(backend, "name", type(backend).__name__)
                out[f"{field}_version"] = getattr(backend, "version", None)
                out[f"{field}_source"] = getattr(backend, "source", None)
                out[f"{field}_unavailable_reason"] = None
        for package in ("language_tool_python", "rouge_score", "sacrebleu"):
            out[f"{package}_version"] = _package_version(package)
        return out


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------------------------
# Pure components
# ----------------------------------------------------------------------------------------------

def _missing(package: str, score: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"the {score} score needs the {package!r} package; install it with "
                               f"pip install 'dllm[eval]'")


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
    try:
        from rouge_score import rouge_scorer
    except ModuleNotFoundError:
        raise _missing("rouge-score", "ROUGE") from None
    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)


@functools.lru_cache(maxsize=1)
def _bleu():
    try:
        from sacrebleu.metrics import BLEU
    except ModuleNotFoundError:
        raise _missing("sacrebleu", "BLEU") from None
    return BLEU(tokenize="13a", smooth_method="none")


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F-measures of the stripped prediction against the stripped reference
    (`rouge-score`, Porter stemming, default tokenizer)."""
    scores = _rouge_scorer().score(reference.strip(), prediction.strip())
    return {key: float(scores[key].fmeasure) for key in ("rouge1", "rouge2", "rougeL")}


def bleu(prediction: str, reference: str) -> float:
    """Corpus BLEU on [0, 1] of one prediction against one reference: up to 4-grams, no smoothing
    (a zero n-gram precision gives 0), brevity penalty, 13a tokenization, case kept."""
    value = _bleu().corpus_score([prediction], [[reference]]).score / 100.0
    return min(1.0, max(0.0, value))   # sacrebleu may return 100.00000000000004


def _grammar(stripped: str, backends: Backends | None) -> float | None:
    if not stripped:
        return 0.0                      # an empty text fails the check by definition
    checker = backends.grammar if backends is not None else None
    if checker is None:
        return None
    return 1.0 if checker.check(stripped) else 0.0


def _product(*parts: float | None) -> float | None:
    if any(part is None for part in parts):
        return None
    out = 1.0
    for part in parts:
        out *= part
    return out


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------

def sentence_to_words_score(prediction: str, answer, *, backends: Backends | None = None) -> dict:
    """Words-to-Sentence. `answer` is `{"words": [...]}`.

    inclusion: 1.0 iff every word is a substring of the raw prediction, case-sensitive
               (`dogs` satisfies `dog`, `Dog` does not, `ice_cream` needs its underscore).
    grammar:   the grammar check of the stripped prediction; None if no backend (0.0 if empty).
    score_v1:  inclusion AND grammar; None if grammar is unavailable.
    headline:  grammar.
    """
    _require_str(prediction)
    words = _answer_field(answer, "words", "sentence_to_words_score", list)
    if not all(isinstance(word, str) for word in words):
        raise ValueError(f"sentence_to_words_score: answer['words'] must be a list of strings, got {words!r}")
    inclusion = 1.0 if all(word in prediction for word in words) else 0.0
    grammar = _grammar(prediction.strip(), backends)
    return {"inclusion": inclusion, "grammar": grammar, "score_v1": _product(inclusion, grammar),
            "headline": grammar}


def summary_score(prediction: str, answer, *, backends: Backends | None = None) -> dict:
    """Summarization. `answer` is `{"text": dialogue, "summary": reference}`.

    rouge1/rouge2/rougeL: F-measures against the reference summary (see `rouge`).
    grammar:  the grammar check of the stripped prediction; None if no backend (0.0 if empty).
    score_v1: rougeL × grammar; None if grammar is unavailable.
    headline: grammar.
    """
    _require_str(prediction)
    reference = _answer_field(answer, "summary", "summary_score", str)
    scores = rouge(prediction, reference)
    grammar = _grammar(prediction.strip(), backends)
    return {**scores, "grammar": grammar, "score_v1": _product(scores["rougeL"], grammar), "headline": grammar}


def paraphrase_score(prediction: str, answer, *, backends: Backends | None = None) -> dict:
    """Paraphrasing. `answer` is `{"text": original sentence, "examples": ...}`; the stored
    example paraphrases are not used.

    An empty stripped prediction scores 0.0 on every component. Otherwise:
    inv_bleu:  1 − BLEU against the original sentence as the single reference (copying scores 0).
    bertscore: BERTScore F1 against the original sentence; None without a BERTScore backend.
    grammar:   the grammar check of the stripped prediction; None without a grammar backend.
    score_v1:  inv_bleu × bertscore × grammar; None if any part is unavailable.
    headline:  grammar.
    """
    _require_str(prediction)
    original = _answer_field(answer, "text", "paraphrase_score", str)
    _bleu()                 # a missing BLEU package fails here, also for the empty text records are checked with
    stripped = prediction.strip()
    if not stripped:
        return {"inv_bleu": 0.0, "bertscore": 0.0, "grammar": 0.0, "score_v1": 0.0, "headline": 0.0}
    inv_bleu = 1.0 - bleu(stripped, original.strip())
    scorer = backends.bertscore if backends is not None else None
    bertscore = scorer.score(stripped, original.strip()) if scorer is not None else None
    grammar = _grammar(stripped, backends)
    return {"inv_bleu": inv_bleu, "bertscore": bertscore, "grammar": grammar,
            "score_v1": _product(inv_bleu, bertscore, grammar), "headline": grammar}


def _require_str(prediction) -> None:
    if not isinstance(prediction, str):
        raise ValueError(f"prediction must be a str, got {type(prediction).__name__}: {prediction!r}")


def _answer_field(answer, key: str, metric: str, kind: type):
    if not isinstance(answer, Mapping):
        raise ValueError(f"{metric} expects the answer as an object with a {key!r} field, "
                         f"got {type(answer).__name__}: {answer!r}")
    if key not in answer:
        raise ValueError(f"{metric}: the answer has no {key!r} field (keys: {sorted(answer)})")
    value = answer[key]
    if kind is list and isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, kind):
        raise ValueError(f"{metric}: answer[{key!r}] must be a {kind.__name__}, "
                         f"got {type(value).__name__}: {value!r}")
    return value


__all__ = [
    "Backends", "GrammarChecker", "LanguageToolChecker", "BertScorer", "ENV_LANGUAGETOOL_URL",
    "PUBLIC_API_URL", "grammar_checker", "grammar_unavailable_reason", "resolve_grammar", "bert_scorer",
    "resolve_bertscore", "normalize_server_url", "rouge", "bleu", "sentence_to_words_score", "summary_score",
    "paraphrase_score",
]
