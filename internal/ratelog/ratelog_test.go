package ratelog

import (
	"testing"
	"time"
)

func TestLogLimiterLetsOneLinePerInterval(t *testing.T) {
	l := Limiter{Every: time.Minute}
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow(t0); !ok || n != 0 {
		t.Fatalf("first line: ok=%v suppressed=%d", ok, n)
	}
	for i := 1; i <= 5; i++ {
		if ok, _ := l.Allow(t0.Add(time.Duration(i) * time.Second)); ok {
			t.Fatalf("line %d within the interval let through", i)
		}
	}
	if ok, n := l.Allow(t0.Add(time.Minute)); !ok || n != 5 {
		t.Fatalf("after the interval: ok=%v suppressed=%d, want true 5", ok, n)
	}
}

func TestLogLimiterBurst(t *testing.T) {
	l := Limiter{Every: time.Second, Burst: 3}
	t0 := time.Unix(1000, 0)
	passed := 0
	for i := 0; i < 10; i++ {
		if ok, _ := l.Allow(t0.Add(time.Duration(i) * time.Millisecond)); ok {
			passed++
		}
	}
	if passed != 3 {
		t.Fatalf("%d of 10 lines in one interval let through, want the Burst of 3", passed)
	}
	if ok, n := l.Allow(t0.Add(time.Second)); !ok || n != 7 {
		t.Fatalf("next interval: ok=%v suppressed=%d, want true 7", ok, n)
	}
}
