package main

import (
	_ "embed"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// The payments workload: the same seeded cards, amounts, event ids and disorder as the
// transactions workload, written as records of the documented example schema
// examples/features/payment_event.avsc (copied to testdata/ so that the benchmark's
// input stays what it measured if the example changes; plain Avro, no registry
// prefix), keyed by card id, each with the device and the IP it came from, so that
// one stream has several key dimensions (card, device, IP) for the groups benchmark
// (groups.go). card.bin and merchant are null and status is APPROVED: no feature of
// the benchmark reads them, both sides step over them. The keys are correlated and
// skewed the way the reference streams are: a device is shared by
// cardsPerDevice cards, an IP by devicesPerIP devices, and one hot IP takes
// hotIPPermille ‰ of all events whatever their card.

//go:embed testdata/payment_event.avsc
var paymentEventSchema string

// FormatPayments is Workload.Format for payment_event.avsc records.
const FormatPayments = "payments"

const (
	cardsPerDevice = 16
	devicesPerIP   = 4
	hotIPPermille  = 50
	hotIP          = "198.51.100.7"
)

// deviceOf is the device every event of card n comes from: cards n, n+1, … of one
// block of cardsPerDevice share it (Zipf ranks are scattered over card ids, so a
// device's cards are not all hot or all cold).
func deviceOf(card uint32) uint32 { return card / cardsPerDevice }

// appendDeviceID appends the device id of device d: "dev-" and at least 6 digits.
func appendDeviceID(dst []byte, d uint32) []byte {
	return appendPadded(append(dst, "dev-"...), d, 6)
}

// appendIP appends the IP of event i of a workload with seed: the hot IP for
// hotIPPermille ‰ of events (chosen by a hash of the event's index, so the stream of
// cards and amounts is the transactions workload's, draw for draw), else the IP of
// its device's block, 10.a.b.c.
func appendIP(dst []byte, seed uint64, i int, device uint32) []byte {
	if splitmix64(seed^uint64(i)*0x9e3779b97f4a7c15)%1000 < hotIPPermille {
		return append(dst, hotIP...)
	}
	n := device / devicesPerIP
	dst = append(dst, "10."...)
	dst = appendPadded(dst, n>>16&0xff, 1)
	dst = append(dst, '.')
	dst = appendPadded(dst, n>>8&0xff, 1)
	dst = append(dst, '.')
	return appendPadded(dst, n&0xff, 1)
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// appendPadded appends v in decimal, left-padded with zeros to width digits.
func appendPadded(dst []byte, v uint32, width int) []byte {
	var d [10]byte
	i := len(d)
	for {
		i--
		d[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	for pad := len(d) - i; pad < width; pad++ {
		dst = append(dst, '0')
	}
	return append(dst, d[i:]...)
}

// appendDecimal appends v as an Avro decimal's bytes: the unscaled value, big-endian
// two's complement in the fewest bytes that keep its sign (Avro's and Java's
// BigInteger.toByteArray encoding).
func appendDecimal(dst []byte, v int64) []byte {
	n := 8
	for n > 1 {
		top, next := byte(v>>(8*(n-1))), byte(v>>(8*(n-2)))
		if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
			n--
			continue
		}
		break
	}
	dst = codec.AppendLong(dst, int64(n))
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, byte(v>>(8*i)))
	}
	return dst
}

// appendPayment appends the Avro binary of one payment_event.avsc record: txn_id,
// card {id, bin: null}, device_id, ip (null when empty), merchant: null, amount
// (decimal(18,2): minor units of a 2-decimal currency), ts (timestamp-micros),
// status APPROVED.
func appendPayment(dst []byte, id, card, device, ip []byte, amountMinor int64, eventTimeMs int64) []byte {
	dst = codec.AppendLong(dst, int64(len(id)))
	dst = append(dst, id...)
	dst = codec.AppendLong(dst, int64(len(card)))
	dst = append(dst, card...)
	dst = append(dst, 0) // card.bin: union branch 0, null
	for _, s := range [][]byte{device, ip} {
		if len(s) == 0 {
			dst = append(dst, 0) // union branch 0: null
			continue
		}
		dst = append(dst, 2) // union branch 1: string
		dst = codec.AppendLong(dst, int64(len(s)))
		dst = append(dst, s...)
	}
	dst = append(dst, 0) // merchant: null
	dst = appendDecimal(dst, amountMinor)
	dst = codec.AppendLong(dst, eventTimeMs*1000)
	return append(dst, 0) // status: enum index 0, APPROVED
}

// paymentRecord is event i of workload w as a payment_event.avsc record keyed by its card.
func paymentRecord(w *Workload, ev Event, i int, eventTime int64) *kgo.Record {
	key := appendEntityID(make([]byte, 0, 12), ev.Entity)
	var keys [48]byte
	dev := appendDeviceID(keys[:0], deviceOf(ev.Entity))
	ip := appendIP(keys[len(dev):len(dev)], w.Seed, i, deviceOf(ev.Entity))
	v := appendPayment(make([]byte, 0, 128), ev.ID[:], key, dev, ip, ev.AmountMin, eventTime)
	return &kgo.Record{Key: key, Value: v}
}
