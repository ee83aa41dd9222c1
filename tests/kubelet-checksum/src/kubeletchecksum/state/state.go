// Package state declares the Memory Manager checkpoint as the kubelet's JSON and go-spew see it:
// same type names, same field order, same JSON tags (the current format, with pod entries).
package state

import (
	"kubeletchecksum/checksum"
	"kubeletchecksum/v1"
)

type MemoryTable struct {
	TotalMemSize   uint64 `json:"total"`
	SystemReserved uint64 `json:"systemReserved"`
	Allocatable    uint64 `json:"allocatable"`
	Reserved       uint64 `json:"reserved"`
	Free           uint64 `json:"free"`
}

type NUMANodeState struct {
	NumberOfAssignments int                              `json:"numberOfAssignments"`
	MemoryMap           map[v1.ResourceName]*MemoryTable `json:"memoryMap"`
	Cells               []int                            `json:"cells"`
}

type NUMANodeMap map[int]*NUMANodeState

type Block struct {
	NUMAAffinity []int           `json:"numaAffinity"`
	Type         v1.ResourceName `json:"type"`
	Size         uint64          `json:"size"`
}

type ContainerMemoryAssignments map[string]map[string][]Block

type PodEntry struct {
	MemoryBlocks []Block `json:"memoryBlocks,omitempty"`
}

type PodMemoryAssignments map[string]PodEntry

type MemoryManagerCheckpoint struct {
	PolicyName   string                     `json:"policyName"`
	MachineState NUMANodeMap                `json:"machineState"`
	Entries      ContainerMemoryAssignments `json:"entries,omitempty"`
	PodEntries   PodMemoryAssignments       `json:"podEntries,omitempty"`
	Checksum     checksum.Checksum          `json:"checksum"`
}

// New is an empty checkpoint as the kubelet makes one before reading a file into it.
func New() *MemoryManagerCheckpoint {
	return &MemoryManagerCheckpoint{
		MachineState: NUMANodeMap{},
		Entries:      ContainerMemoryAssignments{},
		PodEntries:   PodMemoryAssignments{},
	}
}

// CheckpointData is the newest kubelet's payload, kept as a JSON string in the file.
type CheckpointData struct {
	PolicyName   string                     `json:"policyName"`
	MachineState NUMANodeMap                `json:"machineState"`
	Entries      ContainerMemoryAssignments `json:"entries,omitempty"`
	PodEntries   PodMemoryAssignments       `json:"podEntries,omitempty"`
}
