# ctest: once
"""End-to-end: an SGLang deployment switches from its own metadata server to hf3fs-metad
and keeps its cache (docs/sglang-api.md, Persistence). The reference's state file,
written here by hand as its save_to_disk writes it (json.dump, indent=4), is imported on
the first start with --persistence-path FILE (or --import-sglang-state FILE), never
written, and never imported twice; an invalid file stops the start.

Run: cd tests/e2e && METAD_BIN=... METAD_IO=uring|epoll /usr/bin/python3 -m unittest test_sglang_import
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

from metad_harness import MetadServer, run_to_exit
from test_sglang import SglangClient

# What the reference saved: rank 0's kv pool (LRU order "cold" then "warm"; free stack
# [1, 0], so 0 is handed out next; pages 2 and 4 were in flight, leaked by the
# reference), an older file's bare-rank pool ("3" means "3:kv") and rank 0's indexer pool.
REFERENCE_STATE = {
    "0:kv": {"num_pages": 6, "free_pages": [1, 0],
             "key_to_index": [["cold", 5], ["warm", 3]]},
    "3": {"num_pages": 3, "free_pages": [2], "key_to_index": [["bare-0", 0], ["bare-1", 1]]},
    "0:indexer": {"num_pages": 2, "free_pages": [0, 1], "key_to_index": []},
}


def write_reference_file(path, state):
    with open(path, "w") as f:
        json.dump(state, f, indent=4)  # as save_to_disk: no trailing newline


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class ImportTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="metad-sglang-import-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "meta.json")

    def start(self, *args):
        server = MetadServer(args)
        self.addCleanup(server.stop)
        sg = SglangClient(server.base_url)
        self.addCleanup(sg.close)
        return server, sg

    def test_persistence_path_file_is_imported_once_and_left_unchanged(self):
        write_reference_file(self.path, REFERENCE_STATE)
        original = read_bytes(self.path)
        server, sg = self.start("--persistence-path", self.path, "--save-interval", "60")
        self.assertTrue(server.wait_log(r"imported SGLang state file .*meta\.json"), server.log())
        self.assertTrue(os.path.isdir(self.path + ".metad"))
        # The bound keys answer as they did on the reference; both key forms.
        self.assertEqual(sg.exists(0, ["cold", "warm", "none"]), [True, True, False])
        self.assertEqual(sg.exists(3, ["bare-0", "bare-1"]), [True, True])
        self.assertEqual(sg.get_page_indices(3, ["bare-1", "bare-0"]), [1, 0])
        self.assertEqual(sg.exists(0, ["cold"], "indexer"), [False])
        # The free stack continues where the reference left it (0, then 1), then the two
        # leaked pages (4, 2); then the least recently used key is evicted ("cold": the
        # reads below make "warm" the more recent one only after "cold").
        self.assertEqual(sg.get_page_indices(0, ["cold", "warm"]), [5, 3])
        got = sg.reserve_and_allocate_page_indices(0, ["a", "b", "c", "d", "e"])
        self.assertEqual(got, [(False, 0), (False, 1), (False, 4), (False, 2), (False, 5)])
        sg.confirm_write(0, [("a", 0)], [1, 4, 2, 5])
        self.assertEqual(sg.exists(0, ["cold", "warm", "a"]), [False, True, True])
        self.assertEqual(server.stop(), 0)
        self.assertEqual(read_bytes(self.path), original)

        # The same flags again: the data directory's state, not the file's.
        server, sg = self.start("--persistence-path", self.path)
        self.assertTrue(server.wait_log(r"not imported: the data directory .* holds state"),
                        server.log())
        self.assertFalse(any("imported SGLang state file" in line
                             for line in server.stderr_lines), server.log())
        self.assertEqual(sg.exists(0, ["cold", "warm", "a"]), [False, True, True])
        self.assertEqual(sg.reserve_and_allocate_page_indices(0, ["f"]), [(False, 5)])
        self.assertEqual(server.stop(), 0)
        self.assertEqual(read_bytes(self.path), original)

        # --verify-data-dir lists the pools.
        run = subprocess.run([server.args[0], "--verify-data-dir", self.path + ".metad"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("sglang pools 3, pages 11, bound 4, in flight 1", run.stdout)
        self.assertIn("sglang pool tenant '' rank 0 namespace 'kv': pages 6, bound 2, "
                      "in flight 1, free 3", run.stdout)
        self.assertIn("sglang pool tenant '' rank 3 namespace 'kv': pages 3, bound 2, "
                      "in flight 0, free 1", run.stdout)

    def test_import_flag_with_a_data_dir_survives_a_crash(self):
        write_reference_file(self.path, REFERENCE_STATE)
        data = os.path.join(self.dir, "data")
        server, sg = self.start("--data-dir", data, "--import-sglang-state", self.path)
        self.assertEqual(sg.exists(3, ["bare-0"]), [True])
        # Durable as soon as it answers: a SIGKILL loses nothing of the import.
        server.kill()
        server, sg = self.start("--data-dir", data, "--import-sglang-state", self.path)
        self.assertEqual(sg.exists(3, ["bare-0", "bare-1"]), [True, True])
        self.assertEqual(sg.reserve_and_allocate_page_indices(0, ["x"]), [(False, 0)])

    def test_invalid_or_unreadable_file_refuses_to_start_and_stays_untouched(self):
        bad = {"0:kv": {"num_pages": 2, "free_pages": [0], "key_to_index": [["k", 7]]}}
        cases = [
            (json.dumps(bad, indent=4), r"pool \"0:kv\": key_to_index\[0\]: page 7 is outside"),
            (json.dumps(REFERENCE_STATE)[:-9], "not valid JSON"),
            ('{"0:kv": {"num_pages": 1, "free_pages": [0, 0], "key_to_index": []}}',
             r"free_pages\[1\]: page 0 is listed free twice"),
        ]
        for text, error in cases:
            with self.subTest(error=error):
                with open(self.path, "w") as f:
                    f.write(text)
                code, err, started = run_to_exit(("--persistence-path", self.path))
                self.assertFalse(started, err)
                self.assertNotEqual(code, 0)
                self.assertRegex(err, error)
                self.assertIn("nothing imported", err)
                with open(self.path) as f:
                    self.assertEqual(f.read(), text)
        # Fixed, the file is imported on the next start: nothing was committed before.
        write_reference_file(self.path, REFERENCE_STATE)
        server, sg = self.start("--persistence-path", self.path)
        self.assertEqual(sg.exists(0, ["warm"]), [True])
        self.assertEqual(server.stop(), 0)
        # An unreadable file (a directory here) with --import-sglang-state.
        code, err, started = run_to_exit(("--data-dir", os.path.join(self.dir, "d2"),
                                          "--import-sglang-state", self.dir))
        self.assertFalse(started, err)
        self.assertNotEqual(code, 0)
        self.assertIn("cannot read", err)
        # --import-sglang-state without --data-dir is a usage error.
        code, err, started = run_to_exit(("--import-sglang-state", self.path))
        self.assertEqual(code, 2, err)
        self.assertIn("--import-sglang-state needs --data-dir", err)


class BoundedImportTest(unittest.TestCase):
    """The import is bounded (issue 30, finding 8): only a regular file is read (a FIFO
    blocked the start forever, /dev/zero read until memory ran out), of at most 1 GiB
    and an eighth of what --memory-max leaves, and the pools it declares are charged to
    --memory-max as initialize charges them (a 10 KB file declaring 300 pools of 2^28
    pages took 6 GiB). Each is refused with a message, exit status 1, nothing imported."""

    TIMEOUT = 20  # s: today's code blocks or reads on; it is killed then

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="metad-sglang-bounded-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.data = os.path.join(self.dir, "data")

    def refused(self, path, *extra):
        code, err, started = run_to_exit(("--data-dir", self.data, "--import-sglang-state",
                                          path, *extra), timeout=self.TIMEOUT)
        self.assertFalse(started, err)
        self.assertEqual(code, 1, err)
        self.assertIn("nothing imported", err)
        # Nothing committed: the next start with a good file imports it.
        self.assertFalse(os.path.exists(os.path.join(self.data, "CURRENT")), err)
        return err

    def test_a_fifo_is_refused_without_waiting_for_a_writer(self):
        fifo = os.path.join(self.dir, "state.fifo")
        os.mkfifo(fifo)
        self.assertIn("a FIFO, not a regular file", self.refused(fifo))

    def test_dev_zero_is_refused(self):
        self.assertIn("a character device, not a regular file", self.refused("/dev/zero"))

    def test_a_file_over_1_gib_is_refused_before_it_is_read(self):
        big = os.path.join(self.dir, "big.json")
        with open(big, "wb") as f:
            f.truncate((1 << 30) + 1)  # sparse: no disk used
        err = self.refused(big)
        self.assertRegex(err, rf"{(1 << 30) + 1} bytes, more than the \d+ bytes an SGLang "
                              r"state file may have")

    def test_a_file_over_what_memory_max_leaves_is_refused(self):
        big = os.path.join(self.dir, "big.json")
        with open(big, "wb") as f:
            f.truncate(200 << 20)
        err = self.refused(big, "--memory-max", "1GiB")
        self.assertRegex(err, r"reading takes 8x its size and --memory-max 1073741824 leaves")

    def test_pools_past_memory_max_are_refused_before_their_tables_are_made(self):
        # 3 pools of 2^26 pages: 1 GiB of tables to decode (5 bytes a page), in a tiny file;
        # the second takes the sum past 512 MiB.
        path = os.path.join(self.dir, "meta.json")
        write_reference_file(path, {f"{r}:kv": {"num_pages": 1 << 26, "free_pages": [],
                                                "key_to_index": []} for r in range(3)})
        self.assertLess(os.path.getsize(path), 1024)
        err = self.refused(path, "--memory-max", "512MiB")
        self.assertRegex(err, r'pool "1:kv": the pools up to this one declare 134217728 '
                              r"pages, which take 671088640 bytes to import, more than")
        self.assertIn("(--memory-max)", err)
        # Pools that fit the same budget are imported.
        write_reference_file(path, {f"{r}:kv": {"num_pages": 1 << 20, "free_pages": [],
                                                "key_to_index": []} for r in range(3)})
        server = MetadServer(("--data-dir", self.data, "--import-sglang-state", path,
                              "--memory-max", "512MiB"))
        self.addCleanup(server.stop)
        self.assertTrue(server.wait_log(r"imported SGLang state file .*3 pool\(s\)"),
                        server.log())


if __name__ == "__main__":
    unittest.main()
