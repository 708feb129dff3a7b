package queue

// maxTopicWords: a routing key is at most 255 bytes, so at most 128 words.
const maxTopicWords = 128

// topicMatcher holds a routing key split into words without allocating.
type topicMatcher struct {
	key    []byte
	starts [maxTopicWords + 1]uint8
	ends   [maxTopicWords + 1]uint8
	n      int
}

func (m *topicMatcher) split(key []byte) {
	m.key, m.n = key, 0
	start := 0
	for i := 0; i <= len(key); i++ {
		if i == len(key) || key[i] == '.' {
			m.starts[m.n], m.ends[m.n] = uint8(start), uint8(i)
			m.n++
			start = i + 1
		}
	}
}

func (m *topicMatcher) word(i int) []byte { return m.key[m.starts[i]:m.ends[i]] }
