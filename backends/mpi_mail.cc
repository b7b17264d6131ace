// The rings of the mpi backend's node mail (mpi_mail.h).
//
// The node's ranks share one segment of POSIX shared memory: an inbox per
// rank, of a ring from every other. A ring: a line holding `taken` (the
// messages the receiver is done with, written by it alone), then kSlots
// slots of a 64-byte head and payload_ bytes. Message n (from 1) goes to
// slot (n - 1) % kSlots once n - kSlots are taken; its sender writes the
// head and payload, then releases seq = n, which its receiver acquires.
#include "mpi_mail.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdio>
#include <cstring>
#include <emmintrin.h>
#include <new>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace kreg {
namespace {

constexpr uint64_t kSlots = 8;
constexpr size_t kInboxBytes = size_t{1} << 20;  // a rank's rings together, about (past 8 ranks)
constexpr size_t kMinPayload = 1024, kMaxPayload = 16384;
constexpr size_t kLine = 64, kPage = 4096;

// A contiguous type of `bytes` > INT_MAX bytes: whole GiB blocks and the
// rest.
MPI_Datatype BigType(size_t bytes) {
  constexpr size_t kGiB = size_t{1} << 30;
  MPI_Datatype gib, type;
  MPI_Type_contiguous(static_cast<int>(kGiB), MPI_BYTE, &gib);
  int lengths[2] = {static_cast<int>(bytes / kGiB), static_cast<int>(bytes % kGiB)};
  MPI_Aint offsets[2] = {0, static_cast<MPI_Aint>(bytes / kGiB * kGiB)};
  MPI_Datatype types[2] = {gib, MPI_BYTE};
  MPI_Type_create_struct(2, lengths, offsets, types, &type);
  MPI_Type_commit(&type);
  MPI_Type_free(&gib);
  return type;
}

// Copies a message into a slot around the caches: written with ordinary
// stores, the slot's lines would first be fetched from the receiver's
// cache, which read them last, and then fetched back by the receiver.
void CopyOut(void* slot, const void* from, size_t bytes) {
  if (bytes < 4096) {
    std::memcpy(slot, from, bytes);
    return;
  }
  auto* out = static_cast<__m128i*>(slot);
  const auto* in = static_cast<const __m128i*>(from);
  size_t i = 0;
  for (; i + 4 <= bytes / 16; i += 4) {
    const __m128i a = _mm_loadu_si128(in + i), b = _mm_loadu_si128(in + i + 1);
    const __m128i c = _mm_loadu_si128(in + i + 2), d = _mm_loadu_si128(in + i + 3);
    _mm_stream_si128(out + i, a);
    _mm_stream_si128(out + i + 1, b);
    _mm_stream_si128(out + i + 2, c);
    _mm_stream_si128(out + i + 3, d);
  }
  _mm_sfence();  // before the release of seq
  std::memcpy(out + i, in + i, bytes - i * 16);
}

}  // namespace

struct alignas(kLine) NodeMail::SlotHead {
  std::atomic<uint64_t> seq;  // the message in the slot (0: none yet)
  int32_t tag;
  uint32_t via_mpi;  // 1: an envelope; the message goes through MPI
  uint64_t bytes;
};

int PostMpi(bool send, void* buf, size_t bytes, int peer, int tag, MPI_Comm comm, MPI_Request* request) {
  MPI_Datatype type = MPI_BYTE;
  int count = static_cast<int>(bytes);
  if (bytes > static_cast<size_t>(INT_MAX)) {  // one element of a type of `bytes` bytes
    type = BigType(bytes);
    count = 1;
  }
  const int code = send ? MPI_Isend(buf, count, type, peer, tag, comm, request)
                        : MPI_Irecv(buf, count, type, peer, tag, comm, request);
  if (type != MPI_BYTE) MPI_Type_free(&type);  // freed once the request is done
  return code;
}

std::unique_ptr<NodeMail> NodeMail::Create(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm local;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_size = 1, local_rank = 0;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_rank(local, &local_rank);
  if (local_size < 2 || local_size > kMaxRanks) {
    MPI_Comm_free(&local);
    return nullptr;
  }
  const size_t senders = static_cast<size_t>(local_size - 1);
  const size_t payload = std::clamp(std::bit_floor(kInboxBytes / (kSlots * senders)), kMinPayload, kMaxPayload);
  const size_t ring = kLine + kSlots * (kLine + payload);
  const size_t inbox = (senders * ring + kPage - 1) / kPage * kPage;
  const size_t total = inbox * static_cast<size_t>(local_size);
  // One segment for the node, made by its first rank and unlinked once
  // every rank has it open, so none outlives the ranks however they end.
  // Reserved whole (posix_fallocate): a full /dev/shm fails here, not with
  // SIGBUS later. Fresh, it is zero: every seq and taken.
  static std::atomic<unsigned> made{0};
  char name[64] = "";
  int fd = -1;
  if (local_rank == 0) {
    std::snprintf(name, sizeof name, "/kreg-mpi-%d-%u", static_cast<int>(getpid()), made++);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && (ftruncate(fd, static_cast<off_t>(total)) != 0 ||
                    posix_fallocate(fd, 0, static_cast<off_t>(total)) != 0)) {
      close(fd);
      fd = -1;
    }
    if (fd < 0) {
      shm_unlink(name);
      name[0] = '\0';
    }
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, local);
  if (local_rank != 0 && name[0] != '\0') fd = shm_open(name, O_RDWR, 0);
  void* base = fd < 0 ? MAP_FAILED : mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  int ok = base != MAP_FAILED ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, local);
  if (local_rank == 0 && name[0] != '\0') shm_unlink(name);
  if (!all_ok) {
    if (ok) munmap(base, total);
    MPI_Comm_free(&local);
    return nullptr;
  }
  // The node's ranks as ranks of comm.
  MPI_Group group, local_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(local, &local_group);
  std::vector<int> locals(local_size), ranks(local_size);
  for (int i = 0; i < local_size; ++i) locals[i] = i;
  MPI_Group_translate_ranks(local_group, local_size, locals.data(), group, ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&local_group);
  MPI_Comm_free(&local);
  std::unique_ptr<NodeMail> mail(new NodeMail(comm, static_cast<char*>(base), total, payload));
  mail->peers_.resize(size);
  // Ring i of an inbox is from the i-th other rank of the node.
  auto ring_at = [&](int owner, int from) {
    return mail->base_ + static_cast<size_t>(owner) * inbox + static_cast<size_t>(from - (from > owner)) * ring;
  };
  for (int q = 0; q < local_size; ++q) {
    if (q == local_rank) continue;
    Peer& p = mail->peers_[ranks[q]];
    p.in = ring_at(local_rank, q);
    p.out = ring_at(q, local_rank);
    mail->carried_.push_back(ranks[q]);
  }
  return mail;
}

NodeMail::~NodeMail() { munmap(base_, bytes_); }

NodeMail::SlotHead* NodeMail::Slot(char* ring, uint64_t n) const {
  static_assert(sizeof(SlotHead) == kLine && std::atomic<uint64_t>::is_always_lock_free);
  return reinterpret_cast<SlotHead*>(ring + kLine + ((n - 1) % kSlots) * (kLine + payload_));
}

static std::atomic<uint64_t>& Taken(char* ring) { return *reinterpret_cast<std::atomic<uint64_t>*>(ring); }

void NodeMail::Send(MpiRequest* r) {
  Peer& p = peers_[r->peer];
  r->mail = MpiRequest::Mail::kQueued;
  p.queued.push_back(r);
  Flush(p);
}

void NodeMail::Receive(MpiRequest* r) {
  Peer& p = peers_[r->peer];
  auto early = std::find_if(p.early.begin(), p.early.end(), [&](const Early& e) { return e.tag == r->tag; });
  if (early != p.early.end()) {
    Deliver(r, early->via_mpi, early->bytes, early->data.data());
    p.early.erase(early);
    return;
  }
  r->mail = MpiRequest::Mail::kPosted;
  p.posted.push_back(r);
  Drain(p);
}

void NodeMail::Progress() {
  for (int q : carried_) {
    Peer& p = peers_[q];
    if (!p.queued.empty()) Flush(p);
    Drain(p);
  }
}

void NodeMail::Withdraw(MpiRequest* r) {
  Peer& p = peers_[r->peer];
  std::deque<MpiRequest*>& list = r->mail == MpiRequest::Mail::kQueued ? p.queued : p.posted;
  list.erase(std::remove(list.begin(), list.end(), r), list.end());
}

// Writes the queued sends, in order, while the peer's ring has room.
void NodeMail::Flush(Peer& p) {
  while (!p.queued.empty()) {
    if (p.written - p.taken_seen >= kSlots) {
      p.taken_seen = Taken(p.out).load(std::memory_order_acquire);
      if (p.written - p.taken_seen >= kSlots) return;
    }
    MpiRequest* r = p.queued.front();
    const bool via_mpi = r->bytes > payload_;
    SlotHead* slot = Slot(p.out, p.written + 1);
    slot->tag = r->tag;
    slot->via_mpi = via_mpi ? 1 : 0;
    slot->bytes = r->bytes;
    if (!via_mpi && r->bytes > 0) CopyOut(slot + 1, r->buf, r->bytes);
    slot->seq.store(++p.written, std::memory_order_release);
    r->mail = via_mpi ? MpiRequest::Mail::kNone : MpiRequest::Mail::kDone;
    r->sent = r->bytes;
    p.queued.pop_front();
  }
}

// Takes the messages that came, in order: each to the first receive
// posted for its tag; one with none posted stays in its slot unless a
// receive is posted for a later one or the ring is full.
void NodeMail::Drain(Peer& p) {
  for (;;) {
    SlotHead* slot = Slot(p.in, p.read + 1);
    if (slot->seq.load(std::memory_order_acquire) != p.read + 1) return;
    auto posted = std::find_if(p.posted.begin(), p.posted.end(), [&](MpiRequest* r) { return r->tag == slot->tag; });
    const bool via_mpi = slot->via_mpi != 0;
    // The head is another process's writing: what is read of the slot
    // stays in it.
    const size_t bytes = via_mpi ? slot->bytes : std::min<size_t>(slot->bytes, payload_);
    if (posted != p.posted.end()) {
      MpiRequest* r = *posted;
      p.posted.erase(posted);
      Deliver(r, via_mpi, bytes, slot + 1);
    } else {
      const bool full = Slot(p.in, p.read + kSlots)->seq.load(std::memory_order_acquire) == p.read + kSlots;
      if (p.posted.empty() && !full) return;
      Early& e = p.early.emplace_back();
      e.tag = slot->tag;
      e.via_mpi = via_mpi;
      e.bytes = bytes;
      if (!via_mpi) e.data.assign(reinterpret_cast<const char*>(slot + 1), bytes);
    }
    Taken(p.in).store(++p.read, std::memory_order_release);
  }
}

// Finishes receive r with a message of `bytes` (at `data`, or through MPI).
void NodeMail::Deliver(MpiRequest* r, bool via_mpi, size_t bytes, const void* data) {
  r->matched = true;
  r->sent = bytes;
  if (via_mpi) {
    void* buf = r->buf;
    if (bytes != r->bytes) {  // received aside, so that the sender's send ends; the receive fails
      r->drain.reset(new (std::nothrow) char[std::max<size_t>(bytes, 1)]);
      buf = r->drain.get();
    }
    if (buf != nullptr) {
      r->mail = MpiRequest::Mail::kNone;
      r->code = PostMpi(false, buf, bytes, r->peer, r->mpi_tag, comm_, &r->request);
      if (r->code == MPI_SUCCESS) return;
    }
  } else if (bytes == r->bytes && bytes > 0) {
    std::memcpy(r->buf, data, bytes);
  }
  r->mail = MpiRequest::Mail::kDone;
}

}  // namespace kreg
