"""torchvision's Faster R-CNN (ResNet + FPN, untrained) with a first convolution for every climate channel."""

from __future__ import annotations

from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead

from mlhpc.benchmarks.extreme_weather.config import ExtremeWeatherConfig

CLASS_NAMES = ("tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river")
"""The dataset's class ids 0..3, in order; torchvision's labels are these + 1 (0 is background)."""
NUM_CLASSES = len(CLASS_NAMES)


def build_backbone(cfg: ExtremeWeatherConfig) -> nn.Module:
    """ResNet + FPN from torchvision, no weights, trainable BatchNorm, `num_channels` inputs."""
    backbone = resnet_fpn_backbone(
        backbone_name=cfg.model.backbone,
        weights=None,
        # From scratch the statistics must be learnt: FrozenBatchNorm2d would stay an identity.
        norm_layer=nn.BatchNorm2d,
        trainable_layers=5,
        returned_layers=list(cfg.model.returned_layers),
    )
    stem = backbone.body.conv1
    backbone.body.conv1 = nn.Conv2d(
        cfg.data.num_channels,
        stem.out_channels,
        kernel_size=stem.kernel_size,
        stride=stem.stride,
        padding=stem.padding,
        bias=False,
    )
    nn.init.kaiming_normal_(backbone.body.conv1.weight, mode="fan_out", nonlinearity="relu")
    return backbone


def build_model(cfg: ExtremeWeatherConfig) -> FasterRCNN:
    m = cfg.model
    levels = len(m.returned_layers) + 1  # the FPN adds a max-pooled level on top
    anchors = AnchorGenerator(
        sizes=tuple((size,) for size in m.anchor_sizes),
        aspect_ratios=(tuple(m.aspect_ratios),) * levels,
    )
    channels = cfg.data.num_channels
    backbone = build_backbone(cfg)
    roi_size = 7  # torchvision's MultiScaleRoIAlign output for the box head
    return FasterRCNN(
        backbone,
        box_head=TwoMLPHead(backbone.out_channels * roi_size**2, m.representation_size),
        box_predictor=FastRCNNPredictor(m.representation_size, NUM_CLASSES + 1),
        # Fields are fed at their own size: the transform's resize becomes the identity.
        min_size=min(cfg.data.height, cfg.data.width),
        max_size=max(cfg.data.height, cfg.data.width),
        # The dataset normalizes each channel with its statistics already.
        image_mean=[0.0] * channels,
        image_std=[1.0] * channels,
        rpn_anchor_generator=anchors,
        rpn_pre_nms_top_n_train=m.rpn_pre_nms_top_n_train,
        rpn_pre_nms_top_n_test=m.rpn_pre_nms_top_n_test,
        rpn_post_nms_top_n_train=m.rpn_post_nms_top_n_train,
        rpn_post_nms_top_n_test=m.rpn_post_nms_top_n_test,
        rpn_batch_size_per_image=m.rpn_batch_size_per_image,
        box_batch_size_per_image=m.box_batch_size_per_image,
        box_detections_per_img=m.box_detections_per_img,
        box_score_thresh=m.box_score_thresh,
    )
