// Package checksum declares the checkpoint checksum type, named as the kubelet names it.
package checksum

// Checksum is a checkpoint's FNV-1a 32-bit hash, kept in 64 bits.
type Checksum uint64
