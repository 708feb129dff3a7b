//go:build race

package amqp_test

// raceEnabled: the peer suite (TestAMQP091Suite) runs once, in the plain run.
const raceEnabled = true
