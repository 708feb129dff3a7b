// Package abuse is Warren's hostile-client suite: the malformed and abusive
// clients of issue 11, each run beside a well-behaved publisher/consumer
// pair, with the broker's promises under them asserted rather than watched.
//
// Every probe gets its own warrend child process (a temporary data
// directory, free loopback ports, --log-level warn, a memory high-watermark
// in its config file), so the broker's RSS can be read from
// /proc/PID/status and one probe cannot leave its damage to the next. A run
// of one probe:
//
//  1. start the broker and the pair (loadtest, one producer and one
//     consumer, 2,000 persistent 128-byte msg/s with confirms);
//  2. take the baseline RSS with the pair running, reset VmHWM;
//  3. run the probe for its duration (or until it is done), sampling RSS
//     every 50 ms and the pair's deliveries every 10 ms; a broker whose RSS
//     passes the bound by 512 MiB has the probe stopped early, so a
//     broker without its fix cannot take the machine down;
//  4. for the memory probes, measure how long the pair takes to move again
//     once the flood has stopped and its queue is deleted;
//  5. stop the pair, drain it, and check: the pair lost nothing and
//     received no duplicate; RSS peaked within the probe's bound (baseline +
//     1.2 × watermark for the memory probes, a stated allowance for the
//     others); for the probes that stay under the watermark, the pair's
//     confirm p99 stayed under its bound and it never went longer than
//     MaxGap without a delivery; a new client still logs in, declares,
//     publishes with a confirm and purges.
//
// The probes (Probes) reproduce the findings of issue 11 (the Python
// originals are idle.py, flood.py, slowloris.py, authloop.py, pub.py,
// emptypub.py, deadconsumer.py and decl.py): partial handshakes, an
// idle-socket flood, slowloris, a wrong-password storm, a publisher that
// ignores FLOW, an empty-body flood, stalled auto-ack consumers and a
// declare storm. Full is the sizes (`make abuse`,
// cmd/warren-abuse); Small is the scaled-down run of `make test`.
//
// WARREN_ABUSE_PAIR_LOG=1 prints the pair's per-second progress lines
// (rates, confirm p50/p99) to stderr, to see when in a probe it suffered.
package abuse
