import os

from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as pure_python_crc32c

from tbmem._internal._fastcrc import available, install_reader, masked_crc32c


def reference(data: bytes) -> int:
    """TFRecord's mask over TensorBoard's own pure-Python CRC32C (which tbmem never patches)."""
    x = pure_python_crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_compiled_crc_is_bit_identical():
    assert available()
    for size in (0, 1, 7, 64, 1000, 65537):
        data = os.urandom(size)
        assert masked_crc32c(data) == reference(data)


def test_install_reader_patches_the_record_reader_only():
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
    from tensorboard.summary.writer import record_writer

    assert install_reader()
    assert pywrap_tensorflow.masked_crc32c is masked_crc32c
    # every SummaryWriter's records keep TensorBoard's own CRC function
    assert record_writer.masked_crc32c is not masked_crc32c
    assert record_writer.masked_crc32c.__module__.startswith("tensorboard")
