# Every target creates the virtualenv and installs the package by itself on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# The extras every test venv gets (make test's and make test-pythons' alike).
EXTRAS := dev,bench,spark

.PHONY: install test test-pythons demo lint docs bench dist-check clean

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

# Only the set-up the other targets do: .venv with the package (editable) and its extras.
install: $(STAMP)

# The client's integration tests run a second time with the embedded nsqd cutting every write
# into small random pieces (NSQCLIENT_TESTING_SPLIT_WRITES, see nsqclient/testing/nsqd/writes.py),
# so that frame reassembly is tested on every read boundary.  Skipped against real binaries.
SPLIT_WRITES_TESTS := tests/test_consumer.py tests/test_consumer_faults.py \
	tests/test_consumer_scale.py tests/test_producer.py tests/test_producer_wsgi.py \
	tests/test_conn.py tests/test_conn_writes.py tests/test_compat.py \
	tests/test_consumer_resilience.py tests/test_producer_lifecycle.py \
	tests/test_conn_caller_reads.py tests/test_request_future.py \
	tests/test_youzan_client.py tests/test_producer_lookup.py tests/test_consumer_columnar.py

# make test runs three passes side by side (the suite mostly waits on sockets, timers and JVMs:
# about half a core busy on average): the suite but tests/spark/, the Spark tests (their own
# JVMs), and the split-writes pass (embedded NSQ only); each one's output follows the first's.
# With PYTEST_ARGS, only pytest $(PYTEST_ARGS).
test: $(STAMP)
	@if [ -n "$(PYTEST_ARGS)" ]; then exec $(PY) -m pytest $(PYTEST_ARGS); fi; \
	spark_log=$$(mktemp); split_log=$$(mktemp); split=""; \
	$(PY) -m pytest -p no:cacheprovider tests/spark >"$$spark_log" 2>&1 & spark=$$!; \
	if [ -z "$$NSQ_BIN_DIR" ]; then \
		NSQCLIENT_TESTING_SPLIT_WRITES=1 $(PY) -m pytest -q -p no:cacheprovider \
			$(SPLIT_WRITES_TESTS) >"$$split_log" 2>&1 & split=$$!; \
	fi; \
	$(PY) -m pytest --ignore=tests/spark; status=$$?; \
	wait $$spark; spark_status=$$?; \
	echo "== the Spark tests (tests/spark), beside the suite"; cat "$$spark_log"; \
	if [ $$spark_status -ne 0 ]; then status=$$spark_status; fi; \
	if [ -n "$$split" ]; then \
		wait $$split; split_status=$$?; \
		echo "== again with split writes (NSQCLIENT_TESTING_SPLIT_WRITES=1), beside the suite"; \
		cat "$$split_log"; \
		if [ $$split_status -ne 0 ]; then status=$$split_status; fi; \
	fi; \
	rm -f "$$spark_log" "$$split_log"; \
	exit $$status

# The suite on every other CPython >= 3.11 installed (python3.X on PATH, or pyenv's), each in its
# own .venv-3.X with the same extras; the main venv's version is make test's and is skipped, and a
# version not installed is skipped with a message.  One pass each, without the split-writes pass
# (frame reassembly is not version-specific; SPLIT_WRITES=1 adds it).  Details: .ci/test-pythons.
#   make test-pythons PYTHONS=3.13 PYTEST_ARGS="-x tests/test_conn.py"
test-pythons:
	VENV='$(VENV)' PYTHON='$(PYTHON)' EXTRAS='$(EXTRAS)' PYTEST_ARGS='$(PYTEST_ARGS)' \
		PYTHONS='$(PYTHONS)' SPLIT_WRITES='$(SPLIT_WRITES)' \
		SPLIT_WRITES_TESTS='$(SPLIT_WRITES_TESTS)' .ci/test-pythons

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check nsqclient tests bench examples
	$(VENV)/bin/ruff format --check nsqclient tests bench examples
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W -q -b html docs docs/_build/html

# make bench BENCH_ARGS="--quick"      every case tiny (a smoke test)
# make bench CONSUME_ARGS="-n 1000000" PUBLISH_ARGS="--pipelined-messages 1000000"   full sizes
bench: $(STAMP)
	$(PY) bench/publish.py $(BENCH_ARGS) $(PUBLISH_ARGS)
	$(PY) bench/consume.py $(BENCH_ARGS) $(CONSUME_ARGS)

# The sdist and the wheel as users get them, built from a clean copy of the work tree (python -m
# build; the wheel is built from the sdist) and checked by .ci/check-dist: the wheel holds the
# package only, the sdist its tests, docs and examples; the unpacked sdist installs (not editable)
# into a fresh venv, its tests collect and a few quick ones pass against that install.
# ~1.5-2.5 min; pip fetches the [test] extra.
dist-check: $(STAMP)
	$(PY) .ci/check-dist .

clean:
	rm -rf $(VENV) .venv-3.* docs/_build .pytest_cache
