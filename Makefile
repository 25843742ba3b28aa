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
SPLIT_WRITES_TESTS := tests/consumer/test_consumer.py tests/consumer/test_consumer_faults.py \
	tests/consumer/test_consumer_scale.py tests/producer/test_producer.py \
	tests/producer/test_producer_wsgi.py tests/conn/test_connection.py \
	tests/conn/test_connection_writes.py tests/compat/test_compat.py \
	tests/consumer/test_consumer_resilience.py tests/producer/test_producer_lifecycle.py \
	tests/conn/test_connection_caller_reads.py tests/conn/test_futures.py \
	tests/youzan/test_youzan_client.py tests/producer/test_producer_lookup.py \
	tests/consumer/test_consumer_columnar.py

# The simulated platforms (docs/platforms.rst): these tests run once more in processes where what
# macOS's Python lacks is taken away, and once more where what Windows' lacks is, by
# tests/simulated/sitecustomize.py (NSQCLIENT_SIMULATE=macos|windows, inherited by every process
# the tests start).
SIMULATED_TESTS := tests/test_platforms.py tests/consumer/test_consumer.py \
	tests/consumer/test_consumer_pull.py tests/consumer/test_consumer_columnar.py \
	tests/consumer/test_consumer_faults.py tests/consumer/test_consumer_resilience.py \
	tests/producer/test_producer.py tests/producer/test_producer_async.py \
	tests/producer/test_producer_delivery.py tests/producer/test_producer_lifecycle.py \
	tests/producer/test_producer_lookup.py tests/producer/test_producer_wsgi.py \
	tests/conn/test_connection.py tests/conn/test_connection_caller_reads.py \
	tests/conn/test_connection_writes.py tests/conn/test_futures.py \
	tests/conn/test_transport.py tests/youzan/test_youzan_client.py \
	tests/compat/test_compat.py tests/compat/test_pynsq_tornado.py \
	tests/embedded/test_embedded_dropin.py tests/embedded/test_embedded_standalone.py \
	tests/embedded/test_embedded_nsqd.py tests/embedded/test_embedded_lookupd.py \
	tests/embedded/test_embedded_youzan.py tests/embedded/test_embedded_protocol_v2.py \
	tests/embedded/test_embedded_auth.py tests/otel/test_otel.py \
	tests/otel/test_otel_pull.py tests/otel/test_otel_env.py tests/cli
SIMULATE = NSQCLIENT_SIMULATE=$(1) PYTHONPATH=tests/simulated $(PY) -m pytest -q -p no:cacheprovider

# make test runs five passes side by side (the suite mostly waits on sockets, timers and JVMs:
# about half a core busy on average): the suite but tests/spark/, the Spark tests (their own
# JVMs), the split-writes pass (embedded NSQ only) and the simulated macOS and Windows passes;
# each one's output follows the first's.  With PYTEST_ARGS, only pytest $(PYTEST_ARGS).
test: $(STAMP)
	@if [ -n "$(PYTEST_ARGS)" ]; then exec $(PY) -m pytest $(PYTEST_ARGS); fi; \
	spark_log=$$(mktemp); split_log=$$(mktemp); split=""; \
	macos_log=$$(mktemp); windows_log=$$(mktemp); \
	$(PY) -m pytest -p no:cacheprovider tests/spark >"$$spark_log" 2>&1 & spark=$$!; \
	$(call SIMULATE,macos) $(SIMULATED_TESTS) >"$$macos_log" 2>&1 & macos=$$!; \
	$(call SIMULATE,windows) $(SIMULATED_TESTS) >"$$windows_log" 2>&1 & windows=$$!; \
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
	for platform in macos windows; do \
		if [ $$platform = macos ]; then pid=$$macos; log=$$macos_log; \
		else pid=$$windows; log=$$windows_log; fi; \
		wait $$pid; platform_status=$$?; \
		echo "== on simulated $$platform (NSQCLIENT_SIMULATE=$$platform), beside the suite"; \
		cat "$$log"; \
		if [ $$platform_status -ne 0 ]; then status=$$platform_status; fi; \
	done; \
	rm -f "$$spark_log" "$$split_log" "$$macos_log" "$$windows_log"; \
	exit $$status

# The suite on every other CPython >= 3.11 installed (python3.X on PATH, or pyenv's), each in its
# own .venv-3.X with the same extras; the main venv's version is make test's and is skipped, and a
# version not installed is skipped with a message.  One pass each, without the split-writes pass
# (frame reassembly is not version-specific; SPLIT_WRITES=1 adds it).  Details: .ci/test-pythons.
#   make test-pythons PYTHONS=3.13 PYTEST_ARGS="-x tests/conn/test_connection.py"
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
