// Package refwm is pkg/watermark as of commit 0c93c61, before its dedupe set became
// the compact table (8-byte slots pointing into the acceptance FIFO): the same Stage
// with the 24-byte {hash, time} slots. It is frozen, never to be edited, as the
// reference that pkg/watermark's differential test runs side by side with the
// current package on random operation sequences: any verdict, release, count or
// snapshot byte that differs is a failure. Only tests import it.
package refwm
