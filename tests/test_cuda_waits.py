"""The clean recheck's processes wait for the GPU asleep (``grading.recheck.cuda_waits``): the driver's calls it
makes, and what it says where it cannot."""

import ctypes
import contextlib
import os
import warnings

from fuselab.grading.recheck import cuda_waits


class FakeDriver:
    """The few ``libcuda`` calls ``sleep_in_waits`` makes, recorded; ``devices`` GPUs, ``refuse``: ordinals whose
    flags the driver will not set."""

    def __init__(self, devices=2, init=0, refuse=(), v2=True):
        self.devices, self.init, self.refuse, self.flags = devices, init, set(refuse), {}
        if v2:
            self.cuDevicePrimaryCtxSetFlags_v2 = self._set_flags
        else:
            self.cuDevicePrimaryCtxSetFlags = self._set_flags

    def cuInit(self, flags):
        assert flags == 0
        return self.init

    def cuDeviceGetCount(self, count):
        count._obj.value = self.devices
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = 100 + ordinal  # a handle, not the ordinal: the flags must go to the handle
        return 0

    def _set_flags(self, device, flags):
        ordinal = device.value - 100
        if ordinal in self.refuse:
            return 201  # CUDA_ERROR_INVALID_CONTEXT
        self.flags[ordinal] = flags.value
        return 0


def _with_driver(monkeypatch, driver):
    def cdll(name, *args, **kwargs):
        assert name == "libcuda.so.1"
        if driver is None:
            raise OSError("libcuda.so.1: cannot open shared object file")
        return driver
    monkeypatch.setattr(ctypes, "CDLL", cdll)


def test_every_device_gets_blocking_sync(monkeypatch):
    driver = FakeDriver(devices=3)
    _with_driver(monkeypatch, driver)
    assert cuda_waits.sleep_in_waits() == ""
    assert driver.flags == {0: 0x04, 1: 0x04, 2: 0x04}


def test_an_older_driver_without_the_v2_call_is_used_too(monkeypatch):
    driver = FakeDriver(devices=1, v2=False)
    _with_driver(monkeypatch, driver)
    assert cuda_waits.sleep_in_waits() == ""
    assert driver.flags == {0: cuda_waits.CU_CTX_SCHED_BLOCKING_SYNC}


def test_what_it_could_not_do_is_said_never_raised(monkeypatch):
    _with_driver(monkeypatch, None)
    assert cuda_waits.sleep_in_waits() == "no CUDA driver"
    _with_driver(monkeypatch, FakeDriver(init=100))  # CUDA_ERROR_NO_DEVICE
    assert cuda_waits.sleep_in_waits() == "no CUDA device"
    driver = FakeDriver(devices=2, refuse={1})
    _with_driver(monkeypatch, driver)
    assert cuda_waits.sleep_in_waits() == "device(s) 1 kept spinning"
    assert driver.flags == {0: 0x04}


def test_the_checker_and_the_kernel_worker_sleep_before_cuda_starts(monkeypatch, tmp_path):
    """Both processes that wait on the shared GPU set it first thing: the checker of a student's run and of the
    reference run (no kernel worker), and the kernel worker before it serves a request."""
    from fuselab.grading.recheck import cellrunner, kernel_worker, lazy_plots
    from fuselab.speed import lease
    calls = []
    monkeypatch.setattr(cuda_waits, "sleep_in_waits", lambda: calls.append("sleep") or "")
    # what the two mains set for their whole process stays out of this one's later tests
    monkeypatch.setattr(lazy_plots, "defer", lambda: None)
    monkeypatch.setattr(lease, "ask_through", lambda holder: None)
    monkeypatch.setattr(cellrunner, "_solution_process", lambda: None)
    plan = tmp_path / "plan.json"
    plan.write_text('{"cells": []}')
    for host in (None, type("Host", (), {"ahead": ()})()):
        monkeypatch.setattr(cellrunner, "_kernel_host", lambda host=host: host)
        read, write = os.pipe()
        try:
            with warnings.catch_warnings():  # the filters the checker sets for its process
                cellrunner.main(str(plan), write)
        finally:
            os.close(read)
            with contextlib.suppress(OSError):  # where the checker has not closed its end
                os.close(write)
    assert calls == ["sleep", "sleep"]

    class Stop(Exception):
        pass

    def worker(transfer_fd):
        assert calls == ["sleep", "sleep", "sleep"], "the kernel worker made its CUDA state before the flags"
        raise Stop
    monkeypatch.setattr(kernel_worker, "KernelWorker", worker)
    monkeypatch.setenv(kernel_worker.TRANSFER_ENV, "-1")  # the grader's memory descriptor: never opened here
    read, write = os.pipe()
    try:
        kernel_worker.main(read, write)
    except Stop:
        pass
    finally:
        os.close(read)
        os.close(write)
    assert calls == ["sleep", "sleep", "sleep"]
    assert not lease.asks_a_checker()
