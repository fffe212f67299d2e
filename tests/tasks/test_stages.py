"""The stages' retry condition: what a retry can heal, and what it cannot."""

import errno

from prefect.states import Failed
from support import full_device_error

from spotrl.tasks.stages import retry_transient


def test_the_stages_retry_a_network_hiccup_but_not_a_full_disk_or_a_bug():
    def retried(err):
        return retry_transient(None, None, Failed(data=err))

    assert retried(ConnectionResetError()) and retried(OSError(errno.EIO, "I/O error"))
    assert not retried(full_device_error()) and not retried(ValueError("RESOURCE_EXHAUSTED: ... [os_error_code='28']"))
    assert not retried(ValueError("bad row")) and not retried(FileNotFoundError(2, "gone"))
