"""The champion a model is gated against (--champion), compared on the same test targets.

--champion takes REGISTRY (its current version), a version folder (REGISTRY/v0003), a backtest
report file, or models:/NAME@ALIAS (the MLflow registry: that version is downloaded; when no
version holds the alias yet there is no champion rule, said in one line). Its report holds its
score on the data it was backtested on, and two scores compare only on the same targets (the
same split of the same feature build):

- same data: the rule uses the score in the champion's report, as it always did;
- other data, or data that cannot be told: `hvd-ctsm backtest` evaluates the champion's model
  file on its own targets (as it does --baseline), says so in one line and records it in the
  report (`champion`, and the rule's `record`); `hvd-ctsm gate`, which evaluates nothing,
  refuses a champion measured on other data and names the fix.

"Same data" is the feature build's identity, not its path (relative or written otherwise):
the digest of its metadata.json (hvd_ctsm.data.dataset_meta.metadata_sha256), which every report
records as `data_sha256`. For a report written before that field: the metadata.json deploy
copied beside it, else the one in the folder its `data` names (as written, else from the
report's folder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hvd_ctsm import tracking
from hvd_ctsm.data.dataset_meta import metadata_sha256
from hvd_ctsm.model.checkpoint import model_file, model_sha256

TAKES = ("--champion takes a registry folder (its current version), a version folder "
         "(REGISTRY/vNNNN), a backtest report (.json) or models:/NAME@ALIAS")


def read_json(path: Path) -> object:
    """A JSON file's content; None when it is absent or not JSON (a model.pt, say)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def report_data_sha256(report: dict, path: str | Path | None = None) -> str | None:
    """The identity of the data `report` (read from `path`) was measured on: its data_sha256;
    for an older report, the metadata.json deploy copied beside it (first: the data folder may
    have been rebuilt since), else its `data` folder's, as written, else from the report's
    folder; None when it cannot be told."""
    if report.get("data_sha256"):
        return str(report["data_sha256"])
    near = [Path(path).parent] if path is not None else []
    places = list(near)
    if report.get("data"):
        places += [Path(report["data"])] + [folder / report["data"] for folder in near]
    for folder in places:
        meta = read_json(folder / "metadata.json")
        if isinstance(meta, dict):
            return metadata_sha256(meta)
    return None


@dataclass
class Champion:
    ref: str      # as given to --champion
    report: dict  # its backtest report, as stored
    path: Path    # that report's file (a downloaded copy for models:/)
    unranked: str = ""  # why its model could not be evaluated on a backtest's targets

    @property
    def split(self) -> str:
        return str(self.report.get("split", "test"))

    @property
    def score(self) -> float:
        """The full.ndcg@10 its report holds (the one the champion rule reads)."""
        return float(self.report["model"]["full"]["ndcg@10"])

    def same_data(self, report: dict, path: str | Path | None = None) -> bool | None:
        """Whether its report was measured on the data and split `report` (read from `path`)
        was; None when the data of either cannot be told."""
        if str(report.get("split", "test")) != self.split:
            return False
        ours, theirs = report_data_sha256(report, path), report_data_sha256(self.report, self.path)
        return None if ours is None or theirs is None else ours == theirs

    def model_file(self) -> Path | None:
        """Its model file: beside its report (a deployed version), else where its report says
        (as written, else from the report's folder); only the file its report measured (the
        same sha256: a run folder trained again since holds another)."""
        named = Path(str(self.report.get("model_path") or "missing"))
        want = self.report.get("model_sha256")
        for path in (self.path.parent / "model.pt", named, self.path.parent / named):
            if path.is_file() and (want is None or model_sha256(path) == want):
                return path
        return None

    def data_line(self) -> str:
        return f"{self.report.get('data', 'data not recorded')}, {self.split} split"


def indexes_as(model: Path, data: str) -> bool:
    """Whether the model file indexes items as the dataset at `data` does (its vocab.json):
    a deployed version's metadata.json (its training data's) says so without loading the
    model; a file that does not load is left to the evaluation, which says why."""
    from hvd_ctsm.data.dataset_meta import read_metadata
    from hvd_ctsm.model.checkpoint import CheckpointError, load_state

    wanted = read_metadata(data).vocab_sha256
    deployed = model.parent / "metadata.json"
    if model.parent.joinpath("backtest.json").is_file() and deployed.is_file():
        known = json.loads(deployed.read_text()).get("vocab_sha256")
        if known:
            return known == wanted
    try:
        state = load_state(model)
    except CheckpointError:
        return True
    return state.get("vocab_sha256") == wanted


def read_report(path: Path, ref: str) -> dict:
    """The report --champion names; anything else (a model.pt, another JSON) is one line saying
    what --champion takes (a model.pt was "'utf-8' codec can't decode byte 0x80")."""
    try:
        report = json.loads(path.read_bytes())  # a missing file: "... not found; check the path"
    except ValueError:  # not JSON, or not text at all (UnicodeDecodeError is a ValueError)
        report = None
    if not (isinstance(report, dict) and isinstance(report.get("model"), dict)):
        hint = (f" (for the model deployed there, name its folder {path.parent})"
                if (path.parent / "backtest.json").is_file() else "")
        raise ValueError(f"--champion {ref}: not a backtest report{hint}; {TAKES}")
    return report


def check_ref(ref: str | None) -> None:
    """--champion takes local paths and models:/ URIs (tracking.check_model_ref)."""
    if ref:
        tracking.check_model_ref(ref, "--champion")


def load(ref: str | None, model_path: str | Path, scratch: str | Path) -> Champion | None:
    """The champion --champion names; a models:/ version is downloaded into `scratch`, which
    must outlive its use (the backtest may evaluate its model)."""
    if not ref:
        return None
    check_ref(ref)
    if ref.startswith("models:/"):
        folder = tracking.champion_version(ref, model_file(model_path).parent, Path(scratch))
        if folder is None:
            print(f"no model version holds {ref} yet: the champion rule is skipped")
            return None
        return Champion(ref, read_report(folder / "backtest.json", ref), folder / "backtest.json")
    path = Path(ref)
    if path.is_dir():
        path = model_file(path).parent / "backtest.json"
        if not path.is_file():
            raise ValueError(f"--champion {ref}: no deployed version's report there ({path} "
                             "not found): name a registry deploy wrote to, or leave --champion "
                             "out until the first deploy")
    return Champion(ref, read_report(path, ref), path)


def model_to_evaluate(rival: Champion, here: dict) -> tuple[bool | None, Path | None]:
    """For a backtest (`here`: its data, split and data_sha256): whether the champion's report
    was measured on the same data, and the model file to evaluate on these targets when not
    (None when the same, or when it cannot be told and no model file is found). Other data and
    no model file: refused, before the backtest's work."""
    same = rival.same_data(here)
    model = None if same else rival.model_file()
    if model is not None and not indexes_as(model, here["data"]):
        # Features with items it never saw (the usual retrain, --previous-vocab): it cannot
        # rank these targets, so the rule keeps its stored score, and says so.
        rival.unranked = "its model indexes items otherwise than these features (items new " \
            "since, or another vocabulary)"
        return same, None
    if same is False and model is None:
        digest = rival.report.get("model_sha256")
        raise ValueError(f"--champion {rival.ref}: its report was measured on other data "
                         f"({rival.data_line()}) than this backtest ({here['data']}, "
                         f"{here['split']} split), and the model file it measured"
                         f"{f' (sha256 {digest[:12]}...)' if digest else ''} is neither beside "
                         f"it nor at {rival.report.get('model_path')}, so it cannot be evaluated "
                         "on these targets: name the registry or version folder holding that "
                         "model.pt, or leave --champion out")
    return same, model


def rule_input(rival: Champion, report: dict, same: bool | None) -> dict:
    """What the champion rule compares with (hvd_ctsm.evaluation.gate.apply_gate): `model`, the
    champion's metrics on the report's targets (evaluated there: report['champion']; else its
    stored ones), and `record`, which numbers those are, for the report."""
    record = {"ref": rival.ref, "report_data": rival.report.get("data"),
              "report_split": rival.split, "same_data": same, "stored_ndcg@10": rival.score}
    if "champion" in report:
        record |= {"used": "its model, evaluated on this backtest's targets",
                   "model_path": report.get("champion_path")}
        return {"model": report["champion"], "record": record}
    record["used"] = "its report's score" + (
        " (same data)" if same else f" (other targets: {rival.unranked})" if rival.unranked
        else " (which data it was measured on is not known)")
    return {"model": rival.report["model"], "record": record}


def say_measured(rival: Champion, report: dict, same: bool | None) -> None:
    """One line when the rule does not use the champion's stored score, or cannot check it."""
    if "champion" in report:
        how = "other data" if same is False else "data this backtest cannot match"
        print(f"champion: its report ({rival.ref}: full.ndcg@10 {rival.score:.5f}) was measured "
              f"on {how} ({rival.data_line()}); its model was evaluated on this backtest's "
              f"targets ({report['data']}, {report['split']} split): full.ndcg@10 "
              f"{report['champion']['full']['ndcg@10']:.5f}, which the champion rule uses")
    elif rival.unranked:
        print(f"champion: its report ({rival.ref}) was measured on other targets "
              f"({rival.data_line()}) and {rival.unranked}, so it cannot be evaluated on these: "
              f"the rule uses its stored full.ndcg@10 {rival.score:.5f}, from those targets")
    elif same is None:
        print(f"champion: which data its report ({rival.ref}) was measured on is not known and "
              f"its model file is not found: the rule uses its stored full.ndcg@10 "
              f"{rival.score:.5f}, which may be on other targets")


def unranked_before(rival: Champion, report: dict) -> bool:
    """Whether the backtest that wrote `report` found this champion's model unable to rank its
    targets (rival.unranked), so that its rule used the stored score; notes the reason."""
    for check in report.get("gate", {}).get("checks", []):
        record = check.get("champion") or {}
        if record.get("ref") == rival.ref and "other targets: " in record.get("used", ""):
            rival.unranked = record["used"].split("other targets: ", 1)[1].rstrip(")")
            return True
    return False


def stored_for_gate(rival: Champion, report: dict, path: str | Path) -> dict:
    """The gate step's champion (no model is evaluated there): its stored score when measured
    on the report's data; refused when on other data; with one line when it cannot be told."""
    same = rival.same_data(report, path)
    evaluated = report.get("champion_sha256")  # the backtest evaluated a champion's model
    if not same and evaluated and evaluated == rival.report.get("model_sha256"):
        return rule_input(rival, report, same)  # this one's, on the report's own targets
    if same is False and unranked_before(rival, report):  # as the backtest decided, and said
        say_measured(rival, {}, same)
        return rule_input(rival, {}, same)
    if same is False:
        raise ValueError(f"--champion {rival.ref}: its report was measured on other data "
                         f"({rival.data_line()}) than {path} ({report.get('data')}, "
                         f"{report.get('split', 'test')} split), so the two scores are on other "
                         "targets; run hvd-ctsm backtest with --champion instead, which "
                         "evaluates the champion's model on the same targets")
    if same is None:
        print(f"gate: which data the champion's report ({rival.ref}) or {path} was measured on "
              "is not known: the rule compares the stored scores (hvd-ctsm backtest "
              "--champion evaluates the champion on the same targets)")
    return rule_input(rival, {}, same)
