#include "train/mapped_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/storage_context.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "train/checkpoint_files.h"

namespace loom::train {
namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// The zip reader's view of the mapped bytes (it reads the directory and the pickle record).
class MappedReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MappedReadAdapter(std::shared_ptr<const MappedShard> shard) : shard_(std::move(shard)) {}
  size_t size() const override { return shard_->size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= shard_->size()) return 0;
    n = std::min<size_t>(n, shard_->size() - pos);
    std::memcpy(buf, shard_->data() + pos, n);
    return n;
  }

 private:
  std::shared_ptr<const MappedShard> shard_;
};

// The directory torch.save / torch::pickle_save puts the tensor records of archive "data" in.
constexpr const char* kTensorDir = "data/";

}  // namespace

std::shared_ptr<MappedShard> MappedShard::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("checkpoint file " + path + " is missing or unreadable");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw CheckpointError("checkpoint file " + path + " is missing or unreadable (not a regular file)");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  char* data = nullptr;
  if (size > 0) {
    // Private and writable: a loaded tensor written in place copies its page (copy-on-write)
    // instead of faulting or reaching the file.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string message = sys_error("cannot map checkpoint file", path);
      ::close(fd);
      throw CheckpointError(message);
    }
    data = static_cast<char*>(p);
    ::madvise(p, size, MADV_WILLNEED);  // start reading a file not yet in the page cache
  }
  ::close(fd);  // the mapping keeps the file
  return std::shared_ptr<MappedShard>(new MappedShard(path, data, size));
}

MappedShard::~MappedShard() {
  if (data_) ::munmap(data_, size_);
}

c10::IValue unpickle_in_place(const std::shared_ptr<const MappedShard>& shard) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MappedReadAdapter>(shard));
  // Every tensor record becomes a storage viewing the mapping; the unpickler takes storages
  // from this context instead of reading (copying) the records.
  auto storages = std::make_shared<torch::jit::DeserializationStorageContext>();
  const std::string dir = kTensorDir;
  for (const std::string& record : reader.getAllRecords()) {
    if (record.compare(0, dir.size(), dir) != 0) continue;
    const size_t offset = reader.getRecordOffset(record), bytes = reader.getRecordSize(record);
    if (offset > shard->size() || bytes > shard->size() - offset)
      throw std::runtime_error("tensor record " + record + " lies outside the file");
    // The view keeps the mapping alive: one owner reference per storage.
    auto* owner = new std::shared_ptr<const MappedShard>(shard);
    at::DataPtr data(const_cast<char*>(shard->data()) + offset, owner,
                     [](void* ctx) { delete static_cast<std::shared_ptr<const MappedShard>*>(ctx); },
                     at::Device(at::kCPU));
    storages->addStorage(record.substr(dir.size()),
                         c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(data),
                                      /*allocator=*/nullptr, /*resizable=*/false));
  }
  return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                           std::nullopt, std::nullopt, std::nullopt, reader,
                                           torch::jit::Unpickler::defaultTypeParser, storages);
}

}  // namespace loom::train
