"""The sampler lerobot's training script builds, over a SQL selection: lerobot's per-episode drop rule kept.

lerobot-train draws its samples with ``EpisodeAwareSampler(meta.episodes["dataset_from_index"],
meta.episodes["dataset_to_index"], drop_n_last_frames=...)`` (0.4: for policies with ``drop_n_last_frames``,
others shuffle with a plain ``RandomSampler``; 0.6: always). ``lerobot-sql train`` replaces that one name of its
script for the run:

* one dataset (or a collection selection with samples from one dataset): :func:`sampler_class`, lerobot's own
  sampler over the positions :func:`keep_positions` keeps, so shuffling, seeding and resuming are lerobot's;
* samples from several datasets: :func:`mixture_sampler_class`, a :class:`~lerobot_sql.torch.samplers.MixtureSampler`
  over the kept positions (weights or ``n_i ** alpha``, exact per-epoch quotas, single frames drawn in a
  uniformly random interleaving), one global order per (seed, epoch) that accelerate shards across processes,
  resumed at the checkpoint's step on both lerobot versions.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ..errors import TrainSetupError

log = logging.getLogger("lerobot_sql.train")
LOG_EVERY = 1000  # draws between two "drawn so far" lines of the mixture sampler


def keep_positions(manifest, drop_n_first_frames: int = 0, drop_n_last_frames: int = 0):
    """Positions of the samples lerobot's ``EpisodeAwareSampler`` keeps by its rule: a sample whose frame is at least
    ``drop_n_first_frames`` after its episode's first frame and more than ``drop_n_last_frames`` before its
    episode's end (``drop_n_last_frames`` exists so that an action chunk does not run past the episode).

    By the episode, not by the run of the selection: a strided or windowed selection keeps every sample lerobot
    would keep for that frame. int64 array, ascending.

    Raises:
        TrainSetupError: no sample is left (every selected frame is within the dropped ends of its episode).
    """
    idx = manifest["index"].to_numpy()
    start, end = manifest["ep_from_index"].to_numpy(), manifest["ep_to_index"].to_numpy()
    pos = idx - start
    keep = np.flatnonzero((pos >= drop_n_first_frames) & (pos < (end - start) - drop_n_last_frames))
    if len(keep) == 0:
        raise TrainSetupError(f"the policy drops the first {drop_n_first_frames} and last {drop_n_last_frames} frames "
                              f"of each episode, which leaves none of the {len(idx)} selected samples; select frames "
                              "farther from the episode ends")
    return keep.astype(np.int64)


def sampler_class(base, dataset_of):
    """A subclass of lerobot's ``EpisodeAwareSampler`` (``base``) that draws this dataset's samples by the
    per-episode rule of :func:`keep_positions`, whatever ``meta.episodes`` the caller passes, keeping lerobot's own
    shuffling, seeding and resume logic (each kept sample is handed to it as an episode of one frame).

    ``dataset_of()``: the LeRobotSQLDataset being trained on.
    """

    class SelectionSampler(base):
        def __init__(self, dataset_from_indices, dataset_to_indices, episode_indices_to_use=None,
                     drop_n_first_frames: int = 0, drop_n_last_frames: int = 0, *args, **kwargs):
            keep = keep_positions(dataset_of().manifest, drop_n_first_frames, drop_n_last_frames)
            super().__init__(keep.tolist(), (keep + 1).tolist(), None, 0, 0, *args, **kwargs)

    SelectionSampler.__qualname__ = SelectionSampler.__name__ = "SelectionSampler"
    return SelectionSampler


def mixture_sampler_class(dataset_of, *, weights=None, alpha=None, cfg_of=lambda: None, resume_on_init=False):
    """A stand-in for lerobot's ``EpisodeAwareSampler`` drawing a collection dataset's samples as a mixture.

    Built (by lerobot's script) with lerobot's arguments; ``drop_n_first_frames`` / ``drop_n_last_frames`` keep
    :func:`keep_positions`'s per-episode rule, the rest (``dataset_from_indices`` ...) is not needed. Each epoch
    is a :class:`~lerobot_sql.torch.samplers.MixtureSampler` order (``weights`` / ``alpha`` as it takes them,
    ``block_size=1``: single frames, as lerobot's own shuffling) over the kept positions, with
    ``num_replicas=1``: accelerate gives each process its share of the batches. ``len(sampler)`` is an epoch's draws
    (the kept samples' count); ``iter()`` starts the next epoch (lerobot 0.6's rule: the epoch advances at each
    ``iter``). ``state_dict`` / ``load_state_dict`` use lerobot 0.6's ``{"epoch", "start_index"}``.

    Args:
        dataset_of: () -> the :class:`~lerobot_sql.torch.mixture.CollectionDataset` trained on.
        weights, alpha: as :class:`~lerobot_sql.torch.samplers.MixtureSampler`.
        cfg_of: () -> lerobot's parsed train config (its ``seed`` when lerobot passes none: 0.4; on resume its
            ``checkpoint_path`` and ``batch_size``).
        resume_on_init: position the sampler at the checkpoint's step when the run resumes (lerobot 0.4 does
            not; 0.6 calls ``load_state_dict`` itself).

    The sampler logs (logger ``lerobot_sql.train``, INFO) each epoch's quotas, the draws per dataset every
    :data:`LOG_EVERY` draws and at the epoch's end.
    """
    import pyarrow as pa
    import torch

    from .samplers import MixtureSampler

    class MixtureTrainSampler(torch.utils.data.Sampler):
        def __init__(self, dataset_from_indices=None, dataset_to_indices=None, episode_indices_to_use=None,
                     drop_n_first_frames: int = 0, drop_n_last_frames: int = 0, shuffle: bool = True,
                     seed: int | None = None, absolute_to_relative_idx=None, **_ignored):
            ds, cfg = dataset_of(), cfg_of()
            self._keep = keep_positions(ds.manifest, drop_n_first_frames, drop_n_last_frames)
            if seed is None:
                seed = getattr(cfg, "seed", None)
            self.seed = int(seed or 0)
            self.mixture = MixtureSampler(ds.manifest.take(pa.array(self._keep)), weights, alpha=alpha,
                                          block_size=1, seed=self.seed, num_replicas=1, rank=0)
            self.names = list(self.mixture.names)
            self._code = np.asarray(ds.dataset_index, np.int64)
            self._epoch, self._start = 0, 0
            if resume_on_init and getattr(cfg, "resume", False):
                self.load_state_dict(resume_state(cfg, len(self)))

        def __len__(self) -> int:
            return int(self.mixture.num_samples)

        def set_epoch(self, epoch: int) -> None:
            self._epoch = int(epoch)

        def state_dict(self) -> dict:
            return {"epoch": self._epoch, "start_index": self._start}

        def load_state_dict(self, state: dict) -> None:
            self._epoch, self._start = int(state["epoch"]), int(state.get("start_index", state.get("start", 0)))
            if not 0 <= self._start <= len(self):
                raise ValueError(f"start_index {self._start} is outside an epoch of {len(self)} draws")

        def __iter__(self):
            epoch, start = self._epoch, self._start
            self._epoch, self._start = epoch + 1, 0
            return self._iter_epoch(epoch, start)

        def _line(self, counts: np.ndarray) -> str:
            n = max(1, int(counts.sum()))
            return ", ".join(f"{nm}={int(c)} ({c / n:.3f})" for nm, c in zip(self.names, counts)
                             if nm in self.mixture.quotas)

        def _iter_epoch(self, epoch: int, start: int):
            self.mixture.set_epoch(epoch)
            order = self._keep[self.mixture.order()]
            quotas = np.array([self.mixture.quotas.get(nm, 0) for nm in self.names])
            log.info(f"mixture sampler: epoch {epoch} from draw {start} of {len(order)}; quotas {self._line(quotas)}")
            counts = np.zeros(len(self.names), np.int64)
            for k in range(start, len(order)):
                i = int(order[k])
                counts[self._code[i]] += 1
                yield i
                if (k + 1 - start) % LOG_EVERY == 0:
                    log.info(f"mixture sampler: epoch {epoch}, {k + 1 - start} draws so far: {self._line(counts)}")
            log.info(f"mixture sampler: epoch {epoch} drew {int(counts.sum())}: {self._line(counts)}")

    MixtureTrainSampler.__qualname__ = MixtureTrainSampler.__name__ = "MixtureTrainSampler"
    return MixtureTrainSampler


def resume_state(cfg, n: int) -> dict:
    """Where a resumed run's data order goes on: ``{"epoch", "start_index"}`` for the step saved in lerobot's
    checkpoint (``<checkpoint_path>/training_state/training_step.json``), an epoch of ``n`` draws, ``cfg.batch_size``
    and the processes accelerate runs, by lerobot 0.6's ``compute_sampler_state`` rule (one step takes
    ``batch_size * processes`` draws; an epoch is ``ceil(ceil(n / batch_size) / processes)`` steps).

    Raises:
        TrainSetupError: the checkpoint has no readable training step.
    """
    import json

    path = Path(cfg.checkpoint_path) / "training_state" / "training_step.json"
    try:
        step = int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainSetupError(f"{path}: no training step to resume the mixture's order from ({e})") from None
    try:
        from accelerate import PartialState

        procs = int(PartialState().num_processes)
    except Exception:  # noqa: BLE001  (no accelerate state: one process)
        procs = 1
    bs = int(cfg.batch_size)
    per_epoch = math.ceil(math.ceil(n / bs) / procs)
    epoch, into = divmod(step, per_epoch)
    return {"epoch": epoch, "start_index": min(into * bs * procs, n)}
