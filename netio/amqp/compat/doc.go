// Package compat holds the AMQP 0-9-1 compatibility checks of Warren's
// AMQP front (netio/amqp) against third-party clients and against
// RabbitMQ itself: pika_compat.py and run.sh (make amqp-compat), and the
// differential test in diff_test.go (make amqp-diff), which drives the
// same seeded scenarios through amqp091-go against a RabbitMQ and against
// an in-process Warren and compares what the client observes. The
// package has no code of its own.
package compat
