"""Decoding and cropping of encoded images (JPEG, PNG), as in the ImageNet recipes.

Training: a random crop covering 8-100% of the image with aspect ratio 3/4..4/3,
resized to size x size, randomly flipped (Szegedy et al. 2015). Evaluation: resize
so the crop is 87.5% of the shorter side, then the central size x size crop.
"""

from __future__ import annotations

import tensorflow as tf

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_CROP_FRACTION = 0.875


def decode(encoded: tf.Tensor) -> tf.Tensor:
    return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def train_crop(encoded: tf.Tensor, size: int) -> tf.Tensor:
    image = decode(encoded)
    begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    crop = tf.slice(image, begin, crop_size)
    crop = tf.image.resize(crop, [size, size], method="bilinear")
    return tf.image.random_flip_left_right(crop)


def eval_crop(encoded: tf.Tensor, size: int) -> tf.Tensor:
    image = decode(encoded)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = (size / EVAL_CROP_FRACTION) / tf.reduce_min(shape)
    resized = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32), method="bilinear")
    return tf.image.resize_with_crop_or_pad(resized, size, size)


def check_decodable(encoded: bytes) -> str | None:
    """Why these bytes are not an image we can read, or None."""
    try:
        decode(tf.constant(encoded))
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
        return str(exc.message).splitlines()[0] or "cannot decode image"
    return None
