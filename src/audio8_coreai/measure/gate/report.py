"""The gate's report: per-fixture results, totals and verdicts as JSON, and ``report.md``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .tensors import LOW_MARGIN


@dataclass
class FixtureResult:
    """One fixture's rungs, JSON-ready. ``teacher_forced``: a :class:`..parity.ScenarioReport` as a dict with
    ``misses`` carrying margins; ``codec``: ``waveform_cos``, ``waveform_max_diff``, ``logmel_cos``; ``asr`` and
    ``speaker``: the reference's and the port's scores, or ``{"skipped": why}``; paths relative to the report."""

    name: str
    language: str | None
    text: str | None
    seed: int | None
    clone: bool
    teacher_forced: dict
    codec: dict | None = None
    encoder: dict | None = None
    asr: dict | None = None
    speaker: dict | None = None
    picture: str | None = None
    audio: dict[str, str] = field(default_factory=dict)


@dataclass
class GateReport:
    """The whole gate: what was compared, per-fixture results, totals, verdicts and ``passed``."""

    model: str
    port: str
    reference: str
    precision: str
    fixtures: list[FixtureResult] = field(default_factory=list)
    asr: dict = field(default_factory=dict)
    speaker: dict = field(default_factory=dict)
    verdicts: dict = field(default_factory=dict)
    margins: dict = field(default_factory=dict)
    parity: dict | None = None  # the oracle replay (against a fixture.npz), as parity reports it
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def totals(self) -> dict:
        """Teacher-forced sums over the fixtures: agreeing/total draws, min cosines, misses and near-ties."""
        tf = [f.teacher_forced for f in self.fixtures]
        out = {
            k: [sum(t[k][0] for t in tf), sum(t[k][1] for t in tf)]
            for k in ("slow_argmax", "semantic_draws", "codebook_draws")
        }
        out["slow_logits_min_cos"] = min((t["slow_logits_min_cos"] for t in tf), default=1.0)
        out["fast_logits_min_cos"] = min((t["fast_logits_min_cos"] for t in tf), default=1.0)
        misses = [m for t in tf for m in t["misses"]]
        out["misses"] = len(misses)
        out["misses_low_margin"] = sum(m["margin"] < LOW_MARGIN for m in misses)
        runs = [t["free_run_identical"] for t in tf if t["free_run_identical"] is not None]  # None: no free run
        out["free_run_identical"] = [sum(map(bool, runs)), len(runs)]
        out["free_run_frames"] = [
            sum(t["free_run_frames"] or 0 for t in tf),
            sum(t["free_run_expected_frames"] or 0 for t in tf),
        ]
        return out

    @property
    def passed(self) -> bool:
        """No verdict is ``fail`` (skipped and reported rungs do not fail the gate)."""
        flat = [v for v in self.verdicts.values() if isinstance(v, str)]
        flat += [v for d in self.verdicts.values() if isinstance(d, dict) for v in d.values()]
        return not any(v == "fail" for v in flat)

    def to_dict(self) -> dict:
        return {**asdict(self), "totals": self.totals(), "passed": self.passed}


def _fmt_rate(c: dict) -> str:
    return "-" if c["rate"] is None else f"{c['edits']}/{c['units']} = {100 * c['rate']:.1f} %"


def render_markdown(report: GateReport) -> str:
    """``report.md``: verdicts, totals, per-language ASR, speaker, a table per fixture, misses, pictures."""
    t = report.totals()
    lines = [
        f"# Gate: {report.port} against {report.reference}",
        "",
        f"Model `{report.model}`, precision {report.precision}; {_count(len(report.fixtures), 'fixture')} in "
        f"{report.seconds:.0f} s. **{'PASS' if report.passed else 'FAIL'}**",
        "",
        "## Verdicts",
        "",
    ]
    for key, v in report.verdicts.items():
        if isinstance(v, dict):
            v = ", ".join(f"{k}: {x}" for k, x in v.items()) or "-"
        lines.append(f"- {key}: {v}")
    lines += [
        "",
        f"Margins: ASR {report.margins.get('asr')} (absolute rate), speaker {report.margins.get('speaker')} (cosine).",
        "",
        "## Teacher-forced agreement",
        "",
        "| measure | value |",
        "|---|---|",
        f"| semantic draws | {t['semantic_draws'][0]}/{t['semantic_draws'][1]} |",
        f"| codebook draws | {t['codebook_draws'][0]}/{t['codebook_draws'][1]} |",
        f"| slow argmax | {t['slow_argmax'][0]}/{t['slow_argmax'][1]} |",
        f"| slow / fast logits cos min | {t['slow_logits_min_cos']:.6f} / {t['fast_logits_min_cos']:.6f} |",
        f"| misses (near-ties: reference margin < {LOW_MARGIN} logit) | {t['misses']} ({t['misses_low_margin']}) |",
        f"| free runs identical | {t['free_run_identical'][0]}/{t['free_run_identical'][1]} |",
        f"| free-run frames port / reference | {t['free_run_frames'][0]} / {t['free_run_frames'][1]} |",
        "",
    ]
    if report.asr:
        lines += [
            "## ASR round trip",
            "",
            "| language | metric | fixtures | reference | port | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for lang, a in report.asr.items():
            if "skipped" in a:
                lines.append(f"| {lang} | - | {a['fixtures']} | - | - | skipped: {a['skipped']} |")
            else:
                lines.append(
                    f"| {lang} | {a['metric']} | {a['fixtures']} | {_fmt_rate(a['reference'])} | "
                    f"{_fmt_rate(a['port'])} | {report.verdicts['asr'].get(lang)} |"
                )
        lines.append("")
    if report.speaker:
        lines += ["## Speaker similarity (clones)", ""]
        if "skipped" in report.speaker:
            lines.append(f"skipped: {report.speaker['skipped']}")
        else:
            s = report.speaker
            lines.append(
                f"{s['encoder']}, {_count(s['fixtures'], 'clone')}: reference mean {s['reference_mean']:.3f} / min "
                f"{s['reference_min']:.3f}; port mean {s['port_mean']:.3f} / min {s['port_min']:.3f}"
            )
        lines.append("")
    lines += [
        "## Fixtures",
        "",
        "| fixture | lang | semantic | codebook | misses | wav cos | log-mel cos | frames "
        "port/ref | prefix | eos | ASR ref/port | speaker ref/port |",
        "|" + "---|" * 12,
    ]
    for f in report.fixtures:
        tf, c = f.teacher_forced, f.codec or {}
        asr = f.asr or {}
        asr_s = "-" if "port" not in asr else (f"{_pct(asr['reference']['rate'])}/{_pct(asr['port']['rate'])}")
        spk = f.speaker or {}
        spk_s = "-" if "port" not in spk else f"{spk['reference']:.3f}/{spk['port']:.3f}"
        wav = "-" if "waveform_cos" not in c else f"{c['waveform_cos']:.6f}"
        mel = "-" if "logmel_cos" not in c else f"{c['logmel_cos']:.6f}"
        lines.append(
            f"| {f.name} | {f.language or '-'} | {tf['semantic_draws'][0]}/{tf['semantic_draws'][1]} | "
            f"{tf['codebook_draws'][0]}/{tf['codebook_draws'][1]} | {len(tf['misses'])} | {wav} | {mel} | "
            f"{tf['free_run_frames']}/{tf['free_run_expected_frames']} | {tf['free_run_prefix']} | "
            f"{tf['free_run_eos']} | {asr_s} | {spk_s} |"
        )
    misses = [(f.name, m) for f in report.fixtures for m in f.teacher_forced["misses"]]
    if misses:
        lines += [
            "",
            "## Misses (teacher-forced)",
            "",
            "| fixture | step | item | draw | reference | port | margin |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, m in misses:
            draw = "semantic" if m["draw"] == 0 else f"codebook {m['draw']}"
            lines.append(
                f"| {name} | {m['step']} | {m['item']} | {draw} | {m['want']} | {m['got']} | {m['margin']:.4f} |"
            )
    asr_rows = [f for f in report.fixtures if f.asr and "port" in f.asr]
    if asr_rows:
        lines += ["", "## Transcripts", ""]
        for f in asr_rows:
            lines += [
                f"- **{f.name}** text: {f.text}",
                f"  - reference: {f.asr['reference']['text']}",
                f"  - port: {f.asr['port']['text']}",
            ]
    if report.skipped:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in report.skipped]
    lines += ["", "## Pictures", "", "![summary](summary.png)", ""]
    lines += [f"![{f.name}]({f.picture})" for f in report.fixtures if f.picture]
    return "\n".join(lines) + "\n"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f} %"


def _json(value):
    """numpy scalars in the report -> Python numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _count(n: int, thing: str) -> str:
    """``n`` things in words: "1 fixture", "3 fixtures"."""
    return f"{n} {thing}{'' if n == 1 else 's'}"
