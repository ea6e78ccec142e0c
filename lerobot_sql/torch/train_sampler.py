"""The sampler lerobot's training script builds, over a SQL selection: lerobot's per-episode drop rule kept.

lerobot-train draws its samples with ``EpisodeAwareSampler(meta.episodes["dataset_from_index"],
meta.episodes["dataset_to_index"], drop_n_last_frames=...)`` (0.4: for policies with ``drop_n_last_frames``,
others shuffle with a plain ``RandomSampler``; 0.6: always). ``lerobot-sql train`` replaces that one name of its
script for the run:

* one dataset (or a collection selection with samples from one dataset): :func:`sampler_class`, lerobot's own
  sampler over the positions :func:`keep_positions` keeps, so shuffling, seeding and resuming are lerobot's;
* samples from several datasets, or sample weights from a column of the selection (``--weights COLUMN``):
  :func:`mixture_sampler_class`, a :class:`~lerobot_sql.torch.samplers.MixtureSampler` over the kept positions
  (dataset weights or ``n_i ** alpha``, exact per-epoch quotas, single frames drawn in a uniformly random
  interleaving; within each dataset by the sample weights when given) or, for sample weights alone, a
  :class:`~lerobot_sql.torch.samplers.WeightedSampler` (every kept sample in proportion to its weight, across the
  datasets of a collection): one global order per (seed, epoch) that accelerate shards across processes, resumed
  at the checkpoint's step on both lerobot versions.
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


def mixture_sampler_class(dataset_of, *, weights=None, alpha=None, sample_weights: str | None = None,
                          cfg_of=lambda: None, resume_on_init=False):
    """A stand-in for lerobot's ``EpisodeAwareSampler`` drawing a collection dataset's samples as a mixture, or
    any dataset's samples by their weights.

    Built (by lerobot's script) with lerobot's arguments; ``drop_n_first_frames`` / ``drop_n_last_frames`` keep
    :func:`keep_positions`'s per-episode rule, the rest (``dataset_from_indices`` ...) is not needed. Each epoch
    is a :class:`~lerobot_sql.torch.samplers.MixtureSampler` order (``weights`` / ``alpha`` as it takes them, and
    ``sample_weights`` within each dataset) or, with ``sample_weights`` and neither ``weights`` nor ``alpha``, a
    :class:`~lerobot_sql.torch.samplers.WeightedSampler` order, with ``block_size=1`` (single frames, as lerobot's
    own shuffling) over the kept positions, with ``num_replicas=1``: accelerate gives each process its share of the
    batches. ``len(sampler)`` is an epoch's draws (the kept samples' count); ``iter()`` starts the next epoch
    (lerobot 0.6's rule: the epoch advances at each ``iter``). ``state_dict`` / ``load_state_dict`` use lerobot
    0.6's ``{"epoch", "start_index"}``; ``set_epoch(k)``, which accelerate's DataLoader calls before each pass, takes
    ``k`` as the passes since the run started or resumed (the epoch is the resumed one plus ``k``).

    Args:
        dataset_of: () -> the dataset trained on (a :class:`~lerobot_sql.torch.mixture.CollectionDataset`; any
            dataset with ``sample_weights``).
        weights, alpha: as :class:`~lerobot_sql.torch.samplers.MixtureSampler`.
        sample_weights: a column of the selection's result holding each sample's weight (``--weights COLUMN``).
        cfg_of: () -> lerobot's parsed train config (its ``seed`` when lerobot passes none: 0.4; on resume its
            ``checkpoint_path`` and ``batch_size``).
        resume_on_init: position the sampler at the checkpoint's step when the run resumes (lerobot 0.4 does
            not; 0.6 calls ``load_state_dict`` itself).

    The sampler logs (logger ``lerobot_sql.train``, INFO) each epoch's quotas (or expected shares), the draws per
    dataset every :data:`LOG_EVERY` draws and at the epoch's end, and with sample weights the mean weight of the
    draws against its expected value (``sum(e_i * w_i) / sum(e_i)``, ``e_i`` each kept sample's expected draws).

    Raises (when lerobot's script builds it):
        TrainSetupError: the weights cannot be drawn over the kept samples (as the samplers refuse them).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import torch

    from .samplers import MixtureSampler, WeightedSampler

    mixed = sample_weights is None or weights is not None or alpha is not None
    what = "mixture sampler" if mixed else "weighted sampler"

    class MixtureTrainSampler(torch.utils.data.Sampler):
        def __init__(self, dataset_from_indices=None, dataset_to_indices=None, episode_indices_to_use=None,
                     drop_n_first_frames: int = 0, drop_n_last_frames: int = 0, shuffle: bool = True,
                     seed: int | None = None, absolute_to_relative_idx=None, **_ignored):
            ds, cfg = dataset_of(), cfg_of()
            self._keep = keep_positions(ds.manifest, drop_n_first_frames, drop_n_last_frames)
            if seed is None:
                seed = getattr(cfg, "seed", None)
            self.seed = int(seed or 0)
            kept = ds.manifest.take(pa.array(self._keep))
            try:
                if mixed:
                    self.mixture = MixtureSampler(kept, weights, alpha=alpha, sample_weights=sample_weights,
                                                  block_size=1, seed=self.seed, num_replicas=1, rank=0)
                else:
                    self.mixture = WeightedSampler(kept, sample_weights, block_size=1, seed=self.seed,
                                                   num_replicas=1, rank=0)
            except (KeyError, TypeError, ValueError) as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else e
                raise TrainSetupError(f"--weights/--alpha over the {len(self._keep)} samples the policy's "
                                      f"drop_n_first_frames={drop_n_first_frames} / drop_n_last_frames="
                                      f"{drop_n_last_frames} keep: {msg}") from None
            self.names = list(self.mixture.names)
            code = getattr(ds, "dataset_index", None)
            self._code = np.zeros(len(ds), np.int64) if code is None else np.asarray(code, np.int64)
            self._w = None if sample_weights is None else \
                pc.cast(ds.manifest[sample_weights], pa.float64()).to_numpy(zero_copy_only=False)
            e = self.mixture.expected
            self._mean_w = None if self._w is None else float((e * self._w[self._keep]).sum() / e.sum())
            self._epoch, self._start, self._resumed = 0, 0, 0
            if resume_on_init and getattr(cfg, "resume", False):
                self.load_state_dict(resume_state(cfg, len(self)))

        def __len__(self) -> int:
            return int(self.mixture.num_samples)

        def set_epoch(self, epoch: int) -> None:
            # accelerate's DataLoaderShard calls this before every pass with its own count of passes, which starts
            # at 0 in every process, a resumed run's too: the epoch is the one the run resumed at plus that count
            # (taken as the epoch itself, a resumed run past its first epoch replayed epoch 0's order)
            self._epoch = self._resumed + int(epoch)

        def state_dict(self) -> dict:
            return {"epoch": self._epoch, "start_index": self._start}

        def load_state_dict(self, state: dict) -> None:
            self._epoch, self._start = int(state["epoch"]), int(state.get("start_index", state.get("start", 0)))
            self._resumed = self._epoch
            if not 0 <= self._start <= len(self):
                raise ValueError(f"start_index {self._start} is outside an epoch of {len(self)} draws")

        def __iter__(self):
            epoch, start = self._epoch, self._start
            self._epoch, self._start = epoch + 1, 0
            return self._iter_epoch(epoch, start)

        def _line(self, counts: np.ndarray, weight_sum: float | None = None) -> str:
            """Draws per dataset (several datasets), then with sample weights the draws' mean weight."""
            n = max(1, int(counts.sum()))
            shown = self.mixture.quotas if mixed else self.mixture.shares
            parts = [f"{nm}={int(c)} ({c / n:.3f})" for nm, c in zip(self.names, counts)
                     if nm in shown and len(shown) > 1]
            if weight_sum is not None:
                parts.append(f"mean weight {weight_sum / n:.4g} (expected {self._mean_w:.4g})")
            return ", ".join(parts)

        def _head(self) -> str:
            """What the epoch is to draw: the quotas (or expected shares), and the weights' expected mean."""
            if mixed:
                quotas = np.array([self.mixture.quotas.get(nm, 0) for nm in self.names])
                out = [f"quotas {self._line(quotas)}"]
            else:
                out = [f"expected shares {', '.join(f'{nm}={x:.3f}' for nm, x in self.mixture.shares.items())}"] \
                    if len(self.mixture.shares) > 1 else []
            if self._w is not None:
                out.append(f"weights {sample_weights!r}: mean weight expected {self._mean_w:.4g} (unweighted "
                           f"{self._w[self._keep].mean():.4g})")
            return "; ".join(out)

        def _iter_epoch(self, epoch: int, start: int):
            self.mixture.set_epoch(epoch)
            order = self._keep[self.mixture.order()]
            log.info(f"{what}: epoch {epoch} from draw {start} of {len(order)}; {self._head()}")
            counts = np.zeros(len(self.names), np.int64)
            weight_sum = None if self._w is None else 0.0
            for k in range(start, len(order)):
                i = int(order[k])
                counts[self._code[i]] += 1
                if self._w is not None:
                    weight_sum += self._w[i]
                yield i
                if (k + 1 - start) % LOG_EVERY == 0:
                    log.info(f"{what}: epoch {epoch}, {k + 1 - start} draws so far: {self._line(counts, weight_sum)}")
            log.info(f"{what}: epoch {epoch} drew {int(counts.sum())}: {self._line(counts, weight_sum)}")

    name = "MixtureTrainSampler" if mixed else "WeightedTrainSampler"
    MixtureTrainSampler.__qualname__ = MixtureTrainSampler.__name__ = name
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
        raise TrainSetupError(f"{path}: no training step to resume the sampler's order from ({e})") from None
    try:
        from accelerate import PartialState

        procs = int(PartialState().num_processes)
    except Exception:  # noqa: BLE001  (no accelerate state: one process)
        procs = 1
    bs = int(cfg.batch_size)
    per_epoch = math.ceil(math.ceil(n / bs) / procs)
    epoch, into = divmod(step, per_epoch)
    return {"epoch": epoch, "start_index": min(into * bs * procs, n)}
