import os

from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

from tbmem._fastcrc import available, install, masked_crc32c


def test_compiled_crc_is_bit_identical():
    assert available()
    for size in (0, 1, 7, 64, 1000, 65537):
        data = os.urandom(size)
        assert masked_crc32c(data) == reference(data)


def test_install_patches_only_the_record_writer():
    from tensorboard.summary.writer import record_writer

    assert install()
    assert record_writer.masked_crc32c is masked_crc32c
